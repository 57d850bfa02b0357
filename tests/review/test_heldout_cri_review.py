"""Held-out review of fgpu-runtime-proxy: CRI calls and clients its own suite does not use, against real containerd.

Every answer through the proxy is compared with containerd's own answer to the same call. Requests
are written as raw protobuf bytes (field numbers of the CRI's api.proto, `_pb` below) so that no test
helper's message schema stands between the client and containerd. The tests under "defects" were
written failing (strict xfail) and their markers removed with the fix.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from apis.grpc_server import parse_address
from tests.containerd.fixtures import containerd  # noqa: F401 - a fixture
from tests.containerd.harness import Containerd
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import IMAGE, RUNTIME, ContainerSpec, Kubelet, Pod, PodSpec
from tests.runtimeproxy.rig import ProxyRig

pytestmark = pytest.mark.containerd

Answer = tuple[str, bytes | str]


# --- raw protobuf: the CRI's field numbers, no schema of ours in between ----------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _str(number: int, value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _fields(data: bytes) -> list[tuple[int, object]] | None:
    """A message's fields, nested messages decoded and every field list sorted; None if not a message."""
    out: list[tuple[int, object]] = []
    pos = 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            number, wire = key >> 3, key & 7
            if number == 0:
                return None
            if wire == 0:
                value, pos = _read_varint(data, pos)
                out.append((number, value))
            elif wire == 2:
                size, pos = _read_varint(data, pos)
                if pos + size > len(data):
                    return None
                chunk = data[pos : pos + size]
                pos += size
                nested = _fields(chunk) if chunk else None
                out.append((number, chunk if nested is None else nested))
            elif wire in (1, 5):
                width = 8 if wire == 1 else 4
                out.append((number, data[pos : pos + width]))
                pos += width
            else:
                return None
    except IndexError:
        return None
    return sorted(out, key=repr) if pos == len(data) else None


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _same(got: Answer, want: Answer) -> bool:
    """Equal answers, up to the order of fields: containerd writes Go maps (labels) in random order."""
    if got[0] != want[0] or not isinstance(got[1], bytes) or not isinstance(want[1], bytes):
        return got == want
    return got[1] == want[1] or _fields(got[1]) == _fields(want[1]) is not None


def _answer(k: Kubelet, path: str, payload: bytes, *, timeout: float = 20.0) -> Answer:
    try:
        body, _ = k.raw(path, payload, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", body


def _exec(container_id: str, script: str) -> bytes:
    """ExecSyncRequest: container_id = 1, cmd = 2."""
    return _str(1, container_id) + b"".join(_str(2, arg) for arg in ("sh", "-c", script))


# --- fixtures ---------------------------------------------------------------------------------------


class _Node:
    """A proxy in front of the session containerd, a direct client, and one running pod with one container."""

    def __init__(self, ctrd: Containerd, rig: ProxyRig) -> None:
        self.direct = Kubelet(ctrd.address)
        self.proxied = rig.kubelet()
        self.pod: Pod = self.direct.run_pod(PodSpec(name="heldout-cri"))
        self.container_id = self.direct.create_container(
            self.pod, ContainerSpec(name="sleeper", command=["sleep", "600"])
        )
        self.direct.start_container(self.container_id)

    def close(self) -> None:
        self.direct.stop_container(self.container_id)
        self.direct.remove_container(self.container_id)
        self.direct.teardown(self.pod)
        self.direct.close()
        self.proxied.close()


@pytest.fixture(scope="module")
def node(containerd: Containerd) -> Iterator[_Node]:  # noqa: F811 - the fixture above
    rig = ProxyRig(backend=containerd.address).start()
    n = _Node(containerd, rig)
    try:
        yield n
    finally:
        n.close()
        rig.stop()


@pytest.fixture
def hooked(containerd: Containerd) -> Iterator[tuple[ProxyRig, TestHookServer]]:  # noqa: F811
    """A proxy whose test hook server is registered, failurePolicy Fail, for the by-ID stages."""
    base = tempfile.mkdtemp(prefix="fgpu-review-hook-", dir="/tmp")
    server = TestHookServer(socket_path=os.path.join(base, "hooks.sock")).start()
    rig = ProxyRig(backend=containerd.address)
    write_hook_config(
        rig.hook_dir, name="review-hook", endpoint=server.endpoint, policy="Fail",
        stages=["PreUpdateContainerResources", "PostStartContainer", "PostStopContainer"],
    )
    rig.start()
    try:
        yield rig, server
    finally:
        rig.stop()
        server.stop()


# --- every call kubelet and crictl make: the same answer through the proxy --------------------------

# (name, path, request builder from (container id, sandbox id)). Answers must be equal up to the order
# of fields (`_same`: containerd writes Go maps in random order); calls containerd does not implement
# must fail the same. The stats calls and ImageFsInfo carry a timestamp of their own and are left out.
_CALLS: list[tuple[str, str, Callable[[str, str], bytes]]] = [
    ("Version", RUNTIME + "Version", lambda c, s: _str(1, "v1")),
    ("Status verbose", RUNTIME + "Status", lambda c, s: _int(1, 1)),
    ("ListPodSandbox", RUNTIME + "ListPodSandbox", lambda c, s: b""),
    ("ListImages", IMAGE + "ListImages", lambda c, s: b""),
    ("PodSandboxStatus verbose", RUNTIME + "PodSandboxStatus", lambda c, s: _str(1, s) + _int(2, 1)),
    ("ListContainers", RUNTIME + "ListContainers", lambda c, s: b""),
    ("ContainerStatus verbose", RUNTIME + "ContainerStatus", lambda c, s: _str(1, c) + _int(2, 1)),
    ("ReopenContainerLog", RUNTIME + "ReopenContainerLog", lambda c, s: _str(1, c)),
    ("ExecSync", RUNTIME + "ExecSync", lambda c, s: _exec(c, "echo out; echo err >&2; exit 3")),
    ("ExecSync of a missing container", RUNTIME + "ExecSync", lambda c, s: _exec("missing", "true")),
    ("UpdateContainerResources", RUNTIME + "UpdateContainerResources",
     lambda c, s: _str(1, c) + _str(2, _int(4, 256 << 20))),
    ("UpdateRuntimeConfig", RUNTIME + "UpdateRuntimeConfig", lambda c, s: _str(1, _str(1, _str(1, "10.88.0.0/16")))),
    ("PodSandboxStats", RUNTIME + "PodSandboxStats", lambda c, s: _str(1, s)),
    ("ListMetricDescriptors", RUNTIME + "ListMetricDescriptors", lambda c, s: b""),
    ("ListPodSandboxMetrics", RUNTIME + "ListPodSandboxMetrics", lambda c, s: b""),
    ("RuntimeConfig", RUNTIME + "RuntimeConfig", lambda c, s: b""),
    ("CheckpointContainer", RUNTIME + "CheckpointContainer", lambda c, s: _str(1, c) + _str(2, "/tmp/ck.tar")),
    ("ImageStatus verbose", IMAGE + "ImageStatus", lambda c, s: _str(1, _str(1, "fgpu.local/busybox:1")) + _int(2, 1)),
    ("ImageStatus of a missing image", IMAGE + "ImageStatus", lambda c, s: _str(1, _str(1, "missing:1"))),
    ("PullImage unreachable", IMAGE + "PullImage", lambda c, s: _str(1, _str(1, "127.0.0.1:1/none:1"))),
    ("RemoveImage of a missing image", IMAGE + "RemoveImage", lambda c, s: _str(1, _str(1, "missing:1"))),
    ("v1alpha2 Version", "/runtime.v1alpha2.RuntimeService/Version", lambda c, s: _str(1, "v1")),
]


@pytest.mark.parametrize(("path", "request_of"), [pytest.param(p, r, id=n) for n, p, r in _CALLS])
def test_every_cri_call_answers_through_the_proxy_as_containerd_does(
    node: _Node, path: str, request_of: Callable[[str, str], bytes]
) -> None:
    payload = request_of(node.container_id, node.pod.sandbox_id)
    want = _answer(node.direct, path, payload)
    got = _answer(node.proxied, path, payload)
    assert _same(got, want), (got, want)


@pytest.mark.parametrize("method", ["Exec", "Attach", "PortForward"])
def test_streaming_url_calls_answer_a_url_of_containerds_streaming_server(node: _Node, method: str) -> None:
    # the URL carries a one-time token, so only its shape can match
    payload = {
        "Exec": _str(1, node.container_id) + _str(2, "sh") + _int(5, 1),
        "Attach": _str(1, node.container_id) + _int(4, 1),
        "PortForward": _str(1, node.pod.sandbox_id) + _str(2, _varint(80)),
    }[method]
    want = _answer(node.direct, RUNTIME + method, payload)
    got = _answer(node.proxied, RUNTIME + method, payload)
    assert want[0] == got[0] == "OK"
    assert isinstance(want[1], bytes) and isinstance(got[1], bytes)
    assert got[1].rsplit(b"/", 1)[0] == want[1].rsplit(b"/", 1)[0]


@pytest.mark.parametrize("size", [5 << 20, (16 << 20) - 200, 17 << 20], ids=["5MiB", "just under 16MiB", "17MiB"])
def test_big_answers_pass_whole_and_oversized_ones_fail_as_containerd_fails_them(node: _Node, size: int) -> None:
    payload = _exec(node.container_id, f"head -c {size} /dev/zero")
    want = _answer(node.direct, RUNTIME + "ExecSync", payload, timeout=60)
    assert _answer(node.proxied, RUNTIME + "ExecSync", payload, timeout=60) == want


def test_a_deadline_ends_a_proxied_call_when_it_ends_a_direct_one(node: _Node) -> None:
    payload = _exec(node.container_id, "sleep 3")
    for k in (node.direct, node.proxied):
        start = time.monotonic()
        assert _answer(k, RUNTIME + "ExecSync", payload, timeout=0.5)[0] == "DEADLINE_EXCEEDED"
        assert time.monotonic() - start < 2.0


def test_metadata_kubelet_never_sends_crosses_as_it_reaches_containerd(node: _Node) -> None:
    # 40 KB of header fields: the block goes out as HEADERS + CONTINUATIONs, with binary values
    metadata = (("x-review", "plain"), ("x-review-bin", bytes(range(256)) * 80), ("x-long", "v" * 20000))
    payload = _str(1, "v1")
    want = node.direct.raw(RUNTIME + "Version", payload)[0]
    for k in (node.direct, node.proxied):
        call = k.channel.unary_unary(RUNTIME + "Version", request_serializer=None, response_deserializer=None)
        assert call(payload, metadata=metadata, timeout=20) == want


def test_a_gzip_channel_gets_containerds_own_refusal_for_intercepted_and_pass_through_calls(
    containerd: Containerd, node: _Node,  # noqa: F811
) -> None:
    answers = []
    for target in (containerd.address, node.proxied.address):
        k = Kubelet(target)
        k.channel.close()
        k.channel = grpc.insecure_channel(parse_address(target).grpc_target, compression=grpc.Compression.Gzip)
        with k:
            answers.append([
                _answer(k, RUNTIME + "Version", _str(1, "v1")),
                _answer(k, RUNTIME + "CreateContainer", _str(1, "missing")),
                _answer(k, RUNTIME + "RemoveContainer", _str(1, "missing")),
            ])
    assert answers[0] == answers[1]
    assert answers[0][0][0] == "UNIMPLEMENTED"  # containerd 1.6 has no gzip decompressor


# --- defects ----------------------------------------------------------------------------------------


def test_update_of_a_container_named_by_id_prefix_still_runs_its_pre_hook(
    hooked: tuple[ProxyRig, TestHookServer],
) -> None:
    rig, server = hooked
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="prefix-update"))
        try:
            cid = k.create_container(pod, ContainerSpec(name="c", command=["sleep", "60"]))
            # `crictl update --memory ... <short id>` sends the prefix as typed; containerd resolves it
            k.update_resources(cid[:12], memory_limit_in_bytes=128 << 20)
            assert [r.container.id for r in server.requests("PreUpdateContainerResources")] == [cid]
        finally:
            k.teardown(pod)


def test_start_and_stop_of_a_container_named_by_id_prefix_notify_the_post_hooks(
    hooked: tuple[ProxyRig, TestHookServer],
) -> None:
    rig, server = hooked
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="prefix-start"))
        try:
            cid = k.create_container(pod, ContainerSpec(name="c", command=["sleep", "60"]))
            k.start_container(cid[:12])
            k.stop_container(cid[:12])
            deadline = time.monotonic() + 2  # post hooks run beside the call, after kubelet's answer
            while len(server.stages()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sorted(server.stages()) == ["PostStartContainer", "PostStopContainer"]
            notified = server.requests("PostStartContainer") + server.requests("PostStopContainer")
            assert {r.container.id for r in notified} == {cid}
        finally:
            k.teardown(pod)
