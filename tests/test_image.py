"""The image the Dockerfile builds, run by buildah as the image's own user (uid 10001): `mlops --help` through the
ENTRYPOINT, the locked packages and nothing else, a pipeline run on the embedded taxi sample that publishes a version
into a mounted host folder with its TF.js export verified by the image's Node.js, and code that user cannot change.
`make image-test` builds the image and passes --image; without it these tests are skipped."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from components.distributed.tfjob import IMAGE_USER_ID

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = "/app/outputs"
# tests/conftest.py's small run, on the whole embedded sample (the image's default data): a few hundred steps in all.
SMALL_RUN = ["training.train_steps=120", "training.steps_per_epoch=40", "training.eval_steps=10",
             "training.batch_size=64", "beam.direct_running_mode=in_memory", "optimize.fine_tune_steps=40",
             "export.latency_rows=50", "export.max_quantized_degradation=0.05"]
RUN_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def image(request) -> str:
    tag = request.config.getoption("--image")
    if not tag:
        pytest.skip("the image tests run in `make image-test`, which builds the image and passes --image")
    assert shutil.which("buildah"), "buildah is missing: run `sudo make image-deps`."
    return tag


@pytest.fixture(scope="module")
def image_config(image) -> dict:
    inspected = subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, text=True)
    assert inspected.returncode == 0, f"{image} is not in buildah's storage: run `make image-test`.\n{inspected.stderr}"
    return json.loads(inspected.stdout)["OCIv1"]["config"]


@pytest.fixture(scope="module")
def container(image, image_config):
    name = subprocess.run(["buildah", "from", "--pull=never", image], capture_output=True, text=True,
                          check=True).stdout.strip()
    yield name
    subprocess.run(["buildah", "rm", name], capture_output=True, check=True)


# buildah re-executes itself from a sealed memfd copy before COMMAND starts (containers/storage pkg/unshare/unshare.c,
# copy_self_proc_exe); the kernel refuses the seal with EBUSY while the copy's pages are still pinned, which a busy
# machine sometimes shows. COMMAND never ran then, so running it again is safe.
MEMFD_SEAL_BUSY = "sealing memfd copy: Device or resource busy"
MEMFD_ATTEMPTS = 3


def run_in(container: str, *command: str, mounts: dict[Path, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """COMMAND in the container as the image's USER, in its WORKDIR, with its ENV (what `docker run` gives it)."""
    volumes = [flag for host, target in (mounts or {}).items() for flag in ("-v", f"{host}:{target}")]
    for _ in range(MEMFD_ATTEMPTS):
        result = subprocess.run(["buildah", "run", "--isolation", "chroot", *volumes, container, "--", *command],
                                capture_output=True, text=True, timeout=timeout)
        if MEMFD_SEAL_BUSY not in result.stderr:
            break
    return result


def test_the_image_runs_as_its_numeric_non_root_user(container, image_config):
    assert image_config["User"] == str(IMAGE_USER_ID), "numeric, so that Kubernetes can verify runAsNonRoot"
    ids = run_in(container, "id", "-u")
    assert (ids.returncode, ids.stdout.strip()) == (0, str(IMAGE_USER_ID)), ids.stderr


def test_the_entrypoint_with_its_default_command_prints_mlops_help(container, image_config):
    assert image_config["Entrypoint"] == ["python", "-m", "pipeline.cli"] and image_config["Cmd"] == ["--help"]
    result = run_in(container, *image_config["Entrypoint"], *image_config["Cmd"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: mlops") and "run" in result.stdout


def test_the_image_holds_the_lock_files_packages_and_nothing_else(container):
    """The venv is requirements.lock exactly (what `make setup` syncs), and the final stage kept no npm or compiler."""
    listed = run_in(container, "python", "-c", "import importlib.metadata as m; "
                    "print('\\n'.join(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()))")
    assert listed.returncode == 0, listed.stderr

    def normalized(lines):
        return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() + "==" + line.split("==")[1] for line in lines}

    locked = normalized(line for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line
                        and not line.startswith((" ", "#")))
    assert normalized(listed.stdout.split()) == locked
    tools = run_in(container, "sh", "-c", "command -v npm g++ gcc uv || true")
    assert tools.stdout.strip() == ""


def test_the_code_is_read_only_for_the_user_and_outputs_is_writable(container):
    for folder in ("/app/pipeline", "/app/components/exporter/node/node_modules", "/opt/venv/lib"):
        attempt = run_in(container, "touch", f"{folder}/written-by-the-image-user")
        assert attempt.returncode != 0 and "Permission denied" in attempt.stderr, folder
    attempt = run_in(container, "touch", f"{OUTPUTS}/written-by-the-image-user")
    assert attempt.returncode == 0, attempt.stderr


def _containers(document: object):
    """Every container spec in a rendered object, however deep (Deployments, CronJobs, TFJobs, KubeDL's CRDs)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict) and "image" in c)
            else:
                yield from _containers(value)
    elif isinstance(document, list):
        for item in document:
            yield from _containers(item)


def _argv(container: dict, image_config: dict) -> list[str]:
    """What the kubelet runs: command or the ENTRYPOINT, then args (or CMD when neither is set), $(VAR) expanded."""
    command = container.get("command") or image_config["Entrypoint"]
    args = container.get("args", image_config["Cmd"] if "command" not in container else [])
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), word) for word in [*command, *args]]


def test_every_container_command_of_k8s_runs_in_the_image(container, image_config):
    """Each container of k8s/ that runs this image starts a command the image has: its argv with --help appended exits
    0. The other images' containers (TF Serving, rclone, busybox) are theirs to test."""
    from tests.k8s.render import render

    checked = {}
    for kustomization in sorted(ROOT.glob("k8s/**/kustomization.yaml")):
        for spec in _containers(render(kustomization.parent.relative_to(ROOT))):
            if spec["image"].split(":")[0].split("/")[-1] == "tfx-mlops":
                checked.setdefault(tuple(_argv(spec, image_config)), str(kustomization.parent.relative_to(ROOT)))
    assert len(checked) >= 4, checked  # the rollout Job, the monitor, the log proxy, the training workers
    for argv, folder in checked.items():
        result = run_in(container, *argv, "--help")
        assert result.returncode == 0 and result.stdout.startswith("usage:"), (folder, argv, result.stderr[-1500:])


@pytest.fixture(scope="module")
def pipeline_run(container, image_config, tmp_path_factory):
    """`docker run -v HOST:/app/outputs IMAGE run --set ...` on the embedded sample, as the image's user."""
    outputs = tmp_path_factory.mktemp("image_outputs")
    shutil.chown(outputs, IMAGE_USER_ID, IMAGE_USER_ID)
    flags = [flag for override in SMALL_RUN for flag in ("--set", override)]
    result = run_in(container, *image_config["Entrypoint"], "run", *flags, mounts={outputs: OUTPUTS},
                    timeout=RUN_TIMEOUT_S)
    print(result.stdout[-6000:], result.stderr[-6000:], sep="\n")  # the run's console, in the -s/-rA report
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return outputs


def test_the_run_publishes_a_version_into_the_mounted_folder(pipeline_run):
    versions = [path for path in (pipeline_run / "serving" / "taxi").iterdir() if path.name.isdigit()]
    assert len(versions) == 1, "one TF Serving version folder, written by the image's user on the host"
    assert (versions[0] / "saved_model.pb").is_file() and versions[0].stat().st_uid == IMAGE_USER_ID


def test_the_tfjs_export_was_verified_by_the_images_node(pipeline_run, container):
    """The exporter ran the TF.js model in Node.js (the only node in the image: the final stage's /usr/local/bin/node)
    on the eval rows, and its predictions matched the SavedModel's."""
    node = run_in(container, "sh", "-c", "command -v node && node --version")
    assert node.returncode == 0 and node.stdout.split()[0] == "/usr/local/bin/node", node.stderr
    assert node.stdout.split()[1].startswith("v20."), "the Node.js of the Dockerfile's node:20 stage"
    version = next(path for path in (pipeline_run / "serving" / "taxi").iterdir() if path.name.isdigit())
    report = json.loads((version / "export_report.json").read_text())
    artifacts = {row["artifact"]: row for row in report["artifacts"]}
    assert report["passed"] and (version / "tfjs" / "model.json").is_file()
    assert artifacts["tfjs"]["max_abs_diff"] <= 1e-4
