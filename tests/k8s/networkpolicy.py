"""Who a set of NetworkPolicies admits, as the API defines it (kubernetes/kubernetes v1.31.0,
staging/src/k8s.io/api/networking/v1/types.go: NetworkPolicySpec, NetworkPolicyIngressRule, NetworkPolicyPeer,
NetworkPolicyPort), without a CNI:

- a pod is isolated for ingress when a policy of its namespace selects it (podSelector) with `Ingress` among its
  policyTypes (policyTypes unset: Ingress, plus Egress when the policy has egress rules); a pod no policy selects
  admits everything;
- an isolated pod admits a connection when some rule of some policy selecting it admits it (rules and policies are
  ORed): the rule's `from` is empty (every source) or one of its peers matches, and its `ports` are empty (every
  port) or one matches (protocol TCP when unset; `endPort` a range);
- a peer with only `podSelector` selects pods of the policy's own namespace; only `namespaceSelector`, every pod of
  the selected namespaces; both, the selected pods of the selected namespaces (AND); an empty selector selects all.
Egress is the same from the source's side. `ipBlock` peers are not modelled (the sources here are pods)."""
from __future__ import annotations

from dataclasses import dataclass, field

from tests.k8s.gateway_api import _selector_matches


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        # The API server labels every namespace with kubernetes.io/metadata.name (NamespaceDefaultLabelName).
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}

    def __hash__(self) -> int:
        return hash((self.namespace, tuple(sorted(self.labels.items()))))


def _types(policy: dict) -> set[str]:
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return set(spec["policyTypes"])
    return {"Ingress"} | ({"Egress"} if spec.get("egress") else set())


def _selects(policy: dict, pod: Pod) -> bool:
    return policy["metadata"].get("namespace") == pod.namespace and _selector_matches(policy["spec"]["podSelector"],
                                                                                      pod.labels)


def _peer_matches(peer: dict, policy_namespace: str, other: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not _selector_matches(peer["namespaceSelector"], other.ns_labels()):
            return False
    elif other.namespace != policy_namespace:
        return False
    return _selector_matches(peer.get("podSelector"), other.labels)


def _port_matches(ports: list[dict] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry:
            return True
        if isinstance(entry["port"], str):
            raise ValueError("named ports are not modelled; use numbers")
        if entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


def _allowed(policies: list[dict], pod: Pod, other: Pod, port: int, protocol: str, direction: str) -> bool:
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    selecting = [p for p in policies if _selects(p, pod) and direction in _types(p)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key) or []
            if (not peers or any(_peer_matches(peer, pod.namespace, other) for peer in peers)) and \
                    _port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def admits(policies: list[dict], target: Pod, source: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether `source` may open a connection to `target`:`port`, by both pods' policies (ingress of the target's,
    egress of the source's)."""
    return _allowed(policies, target, source, port, protocol, "Ingress") and \
        _allowed(policies, source, target, port, protocol, "Egress")
