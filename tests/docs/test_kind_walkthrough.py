"""The kind walkthrough of docs/tutorials/kubernetes.md cannot run here (no cluster), so its steps are checked for
what broke them on a cluster (issue 42 item 4): each kustomization it applies is rendered and needs its namespaces
made by an earlier step, the project's image loaded onto the node before a pod runs it and a metrics-server before
an HPA reads it; and the rollout needs a Prometheus that selects the servers' PodMonitor (kube-prometheus-stack
selects only PodMonitors labelled with its release unless told otherwise), installed with that PodMonitor before the
first rollout (issue 42 items 4 and 6)."""
from __future__ import annotations

import re
from pathlib import Path

from tests.k8s.render import render

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs/tutorials/kubernetes.md"
SECTION = "## Try it on kind or minikube"
PROJECT_IMAGE = "tfx-mlops:1.0"
# Namespaces a kind cluster has, and the one Envoy Gateway's install.yaml (a URL, not rendered here) creates.
GIVEN_NAMESPACES = {"default", "kube-system", "envoy-gateway-system"}
APPLY = re.compile(r"^kubectl (?:apply|create)\b.*?-k (\S+)")
HELM_INSTALL = re.compile(
    r"^helm install \S+ prometheus-community/kube-prometheus-stack\b.*-n (\S+) --create-namespace")
METRICS_SERVER = re.compile(r"^kubectl apply -f https://github.com/kubernetes-sigs/metrics-server/releases/\S+")
POD_KINDS = {"Deployment": ("spec", "template"), "Job": ("spec", "template"), "Pod": (),
             "CronJob": ("spec", "jobTemplate", "spec", "template")}


def walkthrough_commands(text: str) -> list[str]:
    """The commands of the section's shell blocks, continuation lines joined, comments dropped, in order."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.extend(part.strip() for part in line.split(" && "))
    return commands


def images(objects: list[dict]) -> set[str]:
    found = set()
    for obj in objects:
        if obj["kind"] not in POD_KINDS:
            continue
        spec = obj
        for key in POD_KINDS[obj["kind"]]:
            spec = spec[key]
        spec = spec["spec"]
        found |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return found


def walkthrough_problems(commands: list[str]) -> list[str]:
    """What would fail, step by step, on a fresh kind cluster; empty when nothing would."""
    problems, namespaces, loaded = [], set(GIVEN_NAMESPACES), set()
    prometheus = podmonitor = metrics_server = False
    for command in commands:
        if command.startswith("kind load docker-image "):
            loaded.add(command.split()[3])
        elif METRICS_SERVER.match(command):
            metrics_server = True
        elif match := HELM_INSTALL.match(command):
            namespaces.add(match.group(1))
            prometheus = "podMonitorSelectorNilUsesHelmValues=false" in command
            if not prometheus:
                problems.append(f"{command!r}: this Prometheus selects only PodMonitors labelled with its release")
        elif match := APPLY.match(command):
            objects = render(match.group(1))
            namespaces |= {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
            missing = sorted({o["metadata"].get("namespace") for o in objects} - namespaces - {None})
            if missing:
                problems.append(f"{command!r}: namespace {', '.join(missing)} does not exist yet")
            if PROJECT_IMAGE in images(objects) and PROJECT_IMAGE not in loaded:
                problems.append(f"{command!r}: its pods run {PROJECT_IMAGE}, not loaded onto the node yet")
            if any(o["kind"] == "HorizontalPodAutoscaler" for o in objects) and not metrics_server:
                problems.append(f"{command!r}: its HorizontalPodAutoscalers need a metrics-server, not installed yet")
            podmonitor |= any(o["kind"] == "PodMonitor" for o in objects)
            if match.group(1).rstrip("/").endswith("rollout-job") and not (prometheus and podmonitor):
                problems.append(f"{command!r}: no Prometheus scrapes the servers yet")
        elif command.startswith("mlops rollout start") and not (prometheus and podmonitor):
            problems.append(f"{command!r}: no Prometheus scrapes the servers yet")
    return problems


def test_each_step_of_the_kind_walkthrough_has_what_it_needs():
    commands = walkthrough_commands(PAGE.read_text())
    assert any(c.startswith("mlops rollout start") for c in commands)
    assert any(APPLY.match(c) and APPLY.match(c).group(1) == "k8s/serving/rollout-job" for c in commands)
    assert walkthrough_problems(commands) == []


def test_the_check_finds_the_reviews_three_defects():
    """The walkthrough as the review found it: the project's image loaded only for the Job, no Prometheus, no
    metrics-server."""
    before = ["kubectl apply -k k8s/serving/gateway-envoy",
              "kind load docker-image tensorflow/serving:2.16.1 --name mlops",
              "kubectl apply -k k8s/serving/overlays/dev",
              "kubectl create -k k8s/serving/bootstrap",
              "mlops rollout start --version 2",
              "kind load docker-image tfx-mlops:1.0 --name mlops",
              "kubectl create -k k8s/serving/rollout-job"]
    assert walkthrough_problems(before) == [
        f"'kubectl apply -k k8s/serving/overlays/dev': its pods run {PROJECT_IMAGE}, not loaded onto the node yet",
        "'kubectl apply -k k8s/serving/overlays/dev': its HorizontalPodAutoscalers need a metrics-server, not "
        "installed yet",
        "'mlops rollout start --version 2': no Prometheus scrapes the servers yet",
        "'kubectl create -k k8s/serving/rollout-job': no Prometheus scrapes the servers yet"]
    selective = ["helm install prometheus prometheus-community/kube-prometheus-stack -n monitoring --create-namespace"]
    assert walkthrough_problems(selective) == [
        f"{selective[0]!r}: this Prometheus selects only PodMonitors labelled with its release"]
    early = ["kubectl apply -k k8s/serving/monitoring"]
    assert walkthrough_problems(early) == [f"{early[0]!r}: namespace mlops-serving does not exist yet"]
