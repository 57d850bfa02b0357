"""Which verbs a client certificate may call: one rule for the gRPC service and the extender.

Over mutual TLS the CA vouches for a certificate's names, not for what its holder may do, and one
CA signs both the node agents' certificates and the scheduling side's (kube-scheduler's extender
`tlsConfig`, an operator's fgpuctl). So the names decide:

- A certificate is a *node's identity* when one of its names (common name, subject alternative
  names) is `system:node:<anything>` (kubelet's convention) or is the name of a node this scheduler
  knows. The second clause is what makes an agent certificate with a bare `CN=<node>`, which
  reports for its node, a node's too: otherwise it could sign allocations for any pod.
- READ (Filter, Score, GetNodeState): any certificate.
- REPORT (ReportDevices for node n): only a certificate naming n, as `system:node:n` or `n`.
- SCHEDULE (Reserve, Bind, Unreserve; every extender verb): never a node's identity, nor a
  certificate with no name at all (nothing tells it from a node's). These sign
  or free allocations of any pod on any node; the extender's filter counts too, since with the
  embedded backend the pod it carries is the pod the next bind signs.

Names compare case-insensitively when they make a certificate a node's (DNS names are, and a
refusal too many is the safe side) and exactly when they permit a report. A node is known once its
GPUs are (its first report, or its Device object): until then a bare-named certificate counts as
the scheduling side's, so agents should get `system:node:<node>` certificates.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from apis import names
from scheduler_plugin.errors import Refused


class Verb(enum.Enum):
    """What a call does, as far as who may make it is concerned."""

    READ = enum.auto()
    REPORT = enum.auto()
    SCHEDULE = enum.auto()


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    #: on a refusal: the call, the certificate's names, why, and the fix
    reason: str = ""


ALLOWED = Verdict(allowed=True)

_KUBELET = "kubelet's node naming"
_KNOWN = "a node this scheduler knows"


def _is_prefixed(name: str) -> bool:
    return name.lower().startswith(names.NODE_IDENTITY_PREFIX)


def lookup_names(cert_names: Iterable[str]) -> tuple[str, ...]:
    """The names to look up among the known nodes: the unprefixed ones, as given and lower-cased."""
    out: dict[str, None] = {}
    for name in cert_names:
        if name and not _is_prefixed(name):
            out[name] = None
            out[name.lower()] = None
    return tuple(out)


def node_evidence(cert_names: Iterable[str], *, known_nodes: Collection[str]) -> tuple[str, ...]:
    """The names that make a certificate a node's identity (none: it is not one)."""
    known = {n.lower() for n in known_nodes}
    return tuple(n for n in dict.fromkeys(cert_names) if _is_prefixed(n) or n.lower() in known)


def decide(
    *, cert_names: Collection[str], verb: Verb, call: str, node: str = "", known_nodes: Collection[str] = ()
) -> Verdict:
    """May a client with a verified certificate carrying `cert_names` make `call`?

    `node`: the node a REPORT is for; `known_nodes`: the known nodes among `lookup_names(cert_names)`
    (more do no harm).
    """
    # gRPC lists a name once as common name and again as a DNS name: say each once.
    who = ", ".join(repr(n) for n in dict.fromkeys(cert_names)) or "no name"
    if verb is Verb.READ:
        return ALLOWED
    if verb is Verb.REPORT:
        if node in cert_names or f"{names.NODE_IDENTITY_PREFIX}{node}" in cert_names:
            return ALLOWED
        return Verdict(
            allowed=False,
            reason=(
                f"{call}: report.node_name={node!r}, but the client's certificate names {who}; a node reports only "
                f"its own GPUs: give each agent a certificate whose common name (or a DNS name) is "
                f"{names.NODE_IDENTITY_PREFIX}{node} or {node}"
            ),
        )
    if not cert_names:
        # Nothing to tell it from a node's identity by (a certificate naming nothing we read).
        return Verdict(
            allowed=False,
            reason=(
                f"{call}: refused to a client certificate with no common name and no subject alternative name "
                "this scheduler reads; give kube-scheduler (its extender tlsConfig) or the operator a certificate "
                "whose common name names the caller and no node, e.g. CN=system:kube-scheduler"
            ),
        )
    evidence = node_evidence(cert_names, known_nodes=known_nodes)
    if not evidence:
        return ALLOWED
    why = ", ".join(f"{n!r} ({_KUBELET if _is_prefixed(n) else _KNOWN})" for n in evidence)
    return Verdict(
        allowed=False,
        reason=(
            f"{call}: refused to the client certificate named {who}, a node's identity by {why}: nodes report "
            "their own GPUs and read the state, while the scheduling verbs (Reserve, Bind, Unreserve, the "
            "extender's) sign or free the GPUs of any pod on any node; call with kube-scheduler's certificate (its extender tlsConfig) or an operator's, one "
            f"that names no node and no {names.NODE_IDENTITY_PREFIX}* (e.g. CN=system:kube-scheduler)"
        ),
    )


def check(
    *,
    cert_names: Collection[str],
    verb: Verb,
    call: str,
    node: str = "",
    known_among: Callable[[Sequence[str]], Iterable[str]],
) -> None:
    """`decide`, raising `Refused` (PERMISSION_DENIED, 403) on a refusal. `known_among(names)`: the
    nodes among `names` that the scheduler knows; asked only for SCHEDULE, and only with names."""
    known: Iterable[str] = ()
    if verb is Verb.SCHEDULE and (wanted := lookup_names(cert_names)):
        known = known_among(wanted)
    verdict = decide(cert_names=cert_names, verb=verb, call=call, node=node, known_nodes=tuple(known))
    if not verdict.allowed:
        raise Refused(verdict.reason)
