"""The caller-role rule (scheduler_plugin/caller_roles.py), table-driven; over real TLS in
tests/review/test_caller_roles_review.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from apis.httpserver import peercert_names as peer_names
from scheduler_plugin import caller_roles
from scheduler_plugin.caller_roles import Verb
from scheduler_plugin.errors import Refused

ANYONE = [(), ("system:node:n1",), ("n1",), ("system:kube-scheduler",)]


@pytest.mark.parametrize("cert_names", ANYONE)
def test_any_certificate_reads(cert_names: tuple[str, ...]) -> None:
    verdict = caller_roles.decide(cert_names=cert_names, verb=Verb.READ, call="GetNodeState", known_nodes=("n1",))
    assert verdict.allowed


@pytest.mark.parametrize(
    ("cert_names", "node", "allowed"),
    [
        (("system:node:n1",), "n1", True),
        (("n1",), "n1", True),
        (("fgpu-agent", "n1"), "n1", True),  # a DNS name
        (("system:node:n2",), "n1", False),
        (("n2",), "n1", False),
        (("N1",), "n1", False),  # a permit is exact
        (("system:node:N1",), "n1", False),
        (("fgpu-operator",), "n1", False),
        ((), "n1", False),
    ],
)
def test_a_report_is_taken_only_from_a_certificate_naming_that_node(
    cert_names: tuple[str, ...], node: str, allowed: bool
) -> None:
    verdict = caller_roles.decide(cert_names=cert_names, verb=Verb.REPORT, call="ReportDevices", node=node)
    assert verdict.allowed is allowed
    if not allowed:
        assert f"report.node_name={node!r}" in verdict.reason
        assert f"system:node:{node} or {node}" in verdict.reason
        assert all(repr(n) in verdict.reason for n in cert_names) or "no name" in verdict.reason


@pytest.mark.parametrize(
    ("cert_names", "known", "evidence"),
    [
        (("system:kube-scheduler",), ("n1",), ()),
        (("fgpu-operator",), ("n1",), ()),
        (("system:node:n1",), (), ("system:node:n1",)),
        (("system:node:anything",), ("n1",), ("system:node:anything",)),
        (("System:Node:n1",), (), ("System:Node:n1",)),  # identifying is case-insensitive
        (("n1",), ("n1",), ("n1",)),
        (("N1",), ("n1",), ("N1",)),
        (("fgpu-agent", "n1"), ("n1",), ("n1",)),
        (("n1", "n1"), ("n1",), ("n1",)),  # common name and DNS name alike: once
        # Not known (yet): nothing says this is a node; hence system:node: names for agents.
        (("n1",), (), ()),
    ],
)
def test_a_nodes_identity_never_schedules(cert_names: tuple[str, ...], known: tuple[str, ...], evidence: tuple[str, ...]) -> None:
    verdict = caller_roles.decide(cert_names=cert_names, verb=Verb.SCHEDULE, call="Bind", known_nodes=known)

    assert caller_roles.node_evidence(cert_names, known_nodes=known) == evidence
    assert verdict.allowed is (not evidence)
    if evidence:
        assert verdict.reason.startswith("Bind: refused to the client certificate named ")
        assert all(repr(n) in verdict.reason for n in cert_names)
        assert "names no node" in verdict.reason and "kube-scheduler" in verdict.reason


def test_a_certificate_with_no_name_never_schedules() -> None:
    verdict = caller_roles.decide(cert_names=(), verb=Verb.SCHEDULE, call="extender bind", known_nodes=())
    assert not verdict.allowed
    assert "no common name and no subject alternative name" in verdict.reason and "CN=system:kube-scheduler" in verdict.reason


def test_the_names_looked_up_among_nodes_are_the_unprefixed_ones_as_given_and_lower_cased() -> None:
    assert caller_roles.lookup_names(("system:node:a", "B", "c", "", "b")) == ("B", "b", "c")


def test_check_asks_for_known_nodes_only_to_schedule_and_raises_refused() -> None:
    asked: list[Sequence[str]] = []

    def known_among(wanted: Sequence[str]) -> list[str]:
        asked.append(tuple(wanted))
        return [n for n in wanted if n == "n1"]

    caller_roles.check(cert_names=("n1",), verb=Verb.READ, call="Score", known_among=known_among)
    caller_roles.check(cert_names=("n1",), verb=Verb.REPORT, call="ReportDevices", node="n1", known_among=known_among)
    assert asked == []

    with pytest.raises(Refused, match="'system:node:n2'"):
        caller_roles.check(cert_names=("system:node:n2",), verb=Verb.SCHEDULE, call="Bind", known_among=known_among)
    assert asked == []  # no unprefixed name to look up
    with pytest.raises(Refused, match="'n1' \\(a node this scheduler knows\\)"):
        caller_roles.check(cert_names=("n1",), verb=Verb.SCHEDULE, call="Reserve", known_among=known_among)
    assert asked == [("n1",)]


def test_the_extender_reads_common_names_and_every_subject_alternative_name_of_a_peer_certificate() -> None:
    cert = {
        "subject": ((("organizationName", "system:nodes"),), (("commonName", "system:node:n1"),)),
        "subjectAltName": (("DNS", "n1"), ("IP Address", "10.0.0.1"), ("URI", "spiffe://c/n1"), ("DirName", ((),))),
    }
    assert peer_names(cert) == ("system:node:n1", "n1", "10.0.0.1", "spiffe://c/n1")
