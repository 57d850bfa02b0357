"""Node rules kube-scheduler enforces that the GPU filter would not: taints, cordon, node conditions,
max pods and host ports.

In standalone mode no kube-scheduler stands in front of fgpu, so these are checked here, with
kube-scheduler's own semantics so that a pod lands where kube-scheduler would let it. The core's
filter applies them wherever the Node object is known, extender mode included: there
kube-scheduler has applied them to the nodes it sends already, so the two agree, and a node
refused during a moment's lag of fgpu's view is retried, never misused.

* taints (TaintToleration): a NoSchedule or NoExecute taint the pod does not tolerate refuses the
  node; PreferNoSchedule is a scoring hint and is ignored;
* cordon (NodeUnschedulable): `spec.unschedulable` is read as the taint
  node.kubernetes.io/unschedulable:NoSchedule, so a pod tolerating it (as DaemonSet pods do) passes;
* conditions: kube-scheduler sees only the taints the node lifecycle controller derives from them
  (Ready=False -> not-ready, Ready=Unknown -> unreachable, NetworkUnavailable=True ->
  network-unavailable, all NoSchedule). They are derived here from the conditions directly, so a
  node is refused from the moment its status says so, not only once the controller has caught up;
  a pod that tolerates those taints passes either way;
* max pods (NodeResourcesFit): a node holds at most `status.allocatable.pods` pods;
* host ports (NodePorts): a pod's hostPort must not clash with one a pod on the node holds.

One rule is fgpu's own: a node whose agent says its isolation backend cannot enforce a share
(condition FgpuIsolationReady=False, agent/backendcheck.py) takes no pod that needs software
limits (a GPU share that is not whole GPUs). The agent refuses such containers anyway; the rule
keeps the scheduler from sending them there. It is not a taint on purpose: a pod's tolerations
(even `operator: Exists`, which tolerates every taint) must not switch it off.

Everything here is plain data and pure functions; `node_rules` and `pod_needs` read API dicts.
Pod-level needs standalone mode cannot check at all are in `standalone_limits.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apis import names
from apis.quantity import QuantityError, parse_quantity

#: Taint effects that keep a pod off a node at scheduling time.
HARD_EFFECTS = ("NoSchedule", "NoExecute")
#: A hostIP that binds every address (kube-scheduler's DefaultBindAllHostIP, and its IPv6 twin).
_ANY_IPS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"
    #: why the node carries it, for a taint derived from the node's state ("" for a taint in spec.taints)
    cause: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ToleratesTaint: an empty effect or key matches any; Exists ignores the value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True)
class HostPort:
    port: int
    protocol: str = "TCP"
    #: the hostIP it binds; "0.0.0.0" is every address
    ip: str = "0.0.0.0"

    def clashes(self, other: HostPort) -> bool:
        """kube-scheduler's HostPortInfo.CheckConflict: same port and protocol, and an address in common."""
        if self.port != other.port or self.protocol != other.protocol:
            return False
        return self.ip in _ANY_IPS or other.ip in _ANY_IPS or self.ip == other.ip

    def __str__(self) -> str:
        where = "" if self.ip in _ANY_IPS else f" on {self.ip}"
        return f"{self.port}/{self.protocol}{where}"


@dataclass(frozen=True)
class NodeRules:
    """What a Node object says about taking new pods, read once per update of the Node."""

    #: NoSchedule/NoExecute taints, those derived from cordon and conditions first
    taints: tuple[Taint, ...] = ()
    #: status.allocatable.pods; 0 = not known, not checked
    max_pods: int = 0
    #: why the node cannot enforce GPU share limits (its FgpuIsolationReady condition is False);
    #: "" when it can or does not say
    limits_unenforced: str = ""


@dataclass(frozen=True)
class PodNodeNeeds:
    """What a pod brings to the node rules: its tolerations and the host ports it binds."""

    tolerations: tuple[Toleration, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    #: the pod asks for a GPU share that is not whole GPUs, which only an isolation backend limits
    needs_limits: bool = False


@dataclass(frozen=True)
class Refusal:
    """Why a node rule keeps the pod off a node; `unresolvable` when no pod leaving could change it."""

    text: str
    unresolvable: bool


def untolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> Taint | None:
    """The first taint no toleration matches, or None when the pod tolerates them all."""
    for taint in taints:
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def taint_refusal(taint: Taint) -> Refusal:
    if taint.cause:
        return Refusal(taint.cause, True)
    return Refusal(f"node has taint {taint} the pod does not tolerate", True)


def host_port_refusal(port: HostPort) -> Refusal:
    return Refusal(f"host port {port} is in use on the node", False)


def limits_refusal(why: str) -> Refusal:
    # unresolvable: no pod leaving the node makes its isolation backend work
    return Refusal(why, True)


def max_pods_refusal(pods_on_node: int, max_pods: int) -> Refusal:
    return Refusal(f"too many pods: {pods_on_node} of {max_pods} allowed (status.allocatable.pods)", False)


def port_clash(wanted: Iterable[HostPort], in_use: Iterable[HostPort]) -> HostPort | None:
    """The first of the pod's host ports some pod on the node holds already, or None."""
    held = tuple(in_use)
    for port in wanted:
        if any(port.clashes(other) for other in held):
            return port
    return None


def refusal(
    rules: NodeRules | None, needs: PodNodeNeeds, *, pods_on_node: int, ports_in_use: Iterable[HostPort]
) -> Refusal | None:
    """Why the node's rules refuse the pod, in the order a person would look, or None when they don't.

    Taints and max pods come from the Node object: without it (never seen, or the embedded store)
    they are not checked. Host ports come from the pods alone, so they are checked everywhere.
    """
    taint = untolerated(rules.taints, needs.tolerations) if rules is not None else None
    if taint is not None:
        return taint_refusal(taint)
    if rules is not None and needs.needs_limits and rules.limits_unenforced:
        return limits_refusal(rules.limits_unenforced)
    if needs.host_ports:
        clash = port_clash(needs.host_ports, ports_in_use)
        if clash is not None:
            return host_port_refusal(clash)
    if rules is not None and rules.max_pods and pods_on_node >= rules.max_pods:
        return max_pods_refusal(pods_on_node, rules.max_pods)
    return None


# --- reading API objects ---------------------------------------------------------------------


def node_rules(node: Mapping[str, Any]) -> NodeRules:
    """The rules a Node object (API dict) sets. Malformed entries are skipped: the API server
    validated the object, and a scheduler that refuses a node on a misread is worse than one that
    reads what it can."""
    spec = _mapping(node.get("spec"))
    status = _mapping(node.get("status"))
    derived: list[Taint] = []
    if spec.get("unschedulable") is True:
        derived.append(Taint(names.TAINT_UNSCHEDULABLE, cause="node is cordoned (spec.unschedulable)"))
    condition_list = [c for c in _list(status.get("conditions")) if isinstance(c, Mapping)]
    conditions = {str(c.get("type")): str(c.get("status")) for c in condition_list}
    # A Node with no Ready condition yet (just registered) is not refused: the controller marks
    # it Unknown after its grace period if kubelet never reports.
    if conditions.get("Ready") == "False":
        derived.append(Taint(names.TAINT_NOT_READY, cause="node is not ready (condition Ready=False)"))
    elif conditions.get("Ready") == "Unknown":
        derived.append(Taint(names.TAINT_UNREACHABLE, cause="node is unreachable (condition Ready=Unknown)"))
    if conditions.get("NetworkUnavailable") == "True":
        derived.append(
            Taint(
                names.TAINT_NETWORK_UNAVAILABLE,
                cause="node's network is unavailable (condition NetworkUnavailable=True)",
            )
        )
    seen = {(t.key, t.effect) for t in derived}
    taints = list(derived)
    for raw in _list(spec.get("taints")):
        if not isinstance(raw, Mapping):
            continue
        taint = Taint(key=str(raw.get("key") or ""), value=str(raw.get("value") or ""), effect=str(raw.get("effect") or ""))
        if taint.key and taint.effect in HARD_EFFECTS and (taint.key, taint.effect) not in seen:
            seen.add((taint.key, taint.effect))
            taints.append(taint)
    return NodeRules(
        taints=tuple(taints),
        max_pods=_pods(_mapping(status.get("allocatable")).get("pods")),
        limits_unenforced=_limits_unenforced(condition_list),
    )


def _limits_unenforced(conditions: Sequence[Mapping[str, Any]]) -> str:
    """The refusal text when the agent's FgpuIsolationReady condition is False, else "".

    Unknown or absent is not False: a node whose agent has not reported yet (or an older agent)
    keeps taking shares, and its agent still refuses what it cannot limit."""
    for c in conditions:
        if c.get("type") == names.ISOLATION_READY_CONDITION and c.get("status") == "False":
            reason = str(c.get("reason") or "NotReady")
            message = str(c.get("message") or "").strip()
            detail = f"{reason}: {message}" if message else reason
            return (
                f"node cannot enforce GPU share limits (condition {names.ISOLATION_READY_CONDITION}=False, "
                f"{detail}); whole GPUs still fit there"
            )
    return ""


def pod_needs(pod: Mapping[str, Any]) -> PodNodeNeeds:
    """A pod's tolerations and host ports (API dict)."""
    spec = _mapping(pod.get("spec"))
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in _list(spec.get("tolerations"))
        if isinstance(t, Mapping)
    )
    return PodNodeNeeds(tolerations=tolerations, host_ports=host_ports(pod))


def host_ports(pod: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """Host ports of the pod's containers and sidecars (init containers with restartPolicy Always,
    which run beside the app containers); one-shot init containers have exited before the app starts."""
    spec = _mapping(pod.get("spec"))
    containers = [c for c in _list(spec.get("containers")) if isinstance(c, Mapping)]
    containers += [
        c for c in _list(spec.get("initContainers")) if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    out: list[HostPort] = []
    for container in containers:
        for port in _list(container.get("ports")):
            if not isinstance(port, Mapping):
                continue
            number = _count(port.get("hostPort"))
            if number > 0:
                out.append(
                    HostPort(port=number, protocol=str(port.get("protocol") or "TCP"), ip=str(port.get("hostIP") or "0.0.0.0"))
                )
    return tuple(out)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: object) -> int:
    """A non-negative int (a port number); 0 when it is anything else."""
    return max(value, 0) if isinstance(value, int) and not isinstance(value, bool) else 0


def _pods(value: object) -> int:
    """status.allocatable.pods, a quantity ("110"); 0 (not checked) when absent or unreadable."""
    if value is None:
        return 0
    try:
        return max(int(parse_quantity(value, field="status.allocatable.pods")), 0)
    except QuantityError:
        return 0
