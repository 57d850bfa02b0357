"""Issue 14, defect 5: an intercepted call sent compressed is decompressed, edited, and compressed again."""

from __future__ import annotations

import gzip
import zlib

import grpc
import pytest

from apis import names
from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.h2peers import (
    CREATE_CONTAINER,
    connect_pair,
    create_container_request,
    env_of,
    grpc_frame,
    parse_create_request,
    proxy_before_h2_runtime,
    pump,
    request,
    respond,
    status_of,
)
from tests.runtimeproxy.kubelet import ContainerSpec, Pod, PodSpec
from tests.runtimeproxy.rig import ProxyRig

COMPRESS = {b"gzip": gzip.compress, b"deflate": zlib.compress}
DECOMPRESS = {b"gzip": gzip.decompress, b"deflate": zlib.decompress}


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
def test_a_compressed_create_container_reaches_the_runtime_edited_and_compressed_the_same_way(encoding: bytes) -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        message = create_container_request(envs={"A": "1"}, future_field="kept")
        sid = request(kubelet, CREATE_CONTAINER, grpc_frame(COMPRESS[encoding](message), flag=1),
                      extra=[(b"grpc-encoding", encoding)])
        pump([kubelet, rt], lambda: rt.ended(sid), what="the request at the runtime")

        body = rt.body(sid)
        assert body[0] == 1, "the compressed flag"
        assert int.from_bytes(body[1:5], "big") == len(body) - 5
        edited = DECOMPRESS[encoding](body[5:])
        assert env_of(edited) == {"A": b"1", names.NVIDIA_VISIBLE_DEVICES: b"void"}
        assert parse_create_request(edited).config.fgpu_future_field == "kept"
        assert (b"grpc-encoding", encoding) in rt.headers(sid)

        respond(rt, sid, b"\x0a\x04fake")
        pump([kubelet, rt], lambda: kubelet.ended(sid), what="the answer")
        assert status_of(kubelet, sid) == (0, "")


def test_an_uncompressed_message_under_a_gzip_header_stays_uncompressed() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = request(kubelet, CREATE_CONTAINER, grpc_frame(create_container_request()), extra=[(b"grpc-encoding", b"gzip")])
        pump([kubelet, rt], lambda: rt.ended(sid), what="the request at the runtime")
        body = rt.body(sid)
        assert body[0] == 0
        assert env_of(body[5:])[names.NVIDIA_VISIBLE_DEVICES] == b"void"


def test_a_message_in_an_encoding_the_proxy_does_not_know_is_unimplemented_naming_it() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = request(kubelet, CREATE_CONTAINER, grpc_frame(b"\x00\x01", flag=1), extra=[(b"grpc-encoding", b"snappy")])
        pump([kubelet, rt], lambda: kubelet.ended(sid), what="the refusal")
        code, message = status_of(kubelet, sid)
        assert code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        assert "snappy" in message


def test_grpcio_kubelet_with_gzip_gets_its_container_created_with_the_edits(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime
) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        spec = PodSpec(name="p")
        pod = Pod(spec=spec, sandbox_id="sandbox-1", config=k.pod_config(spec), log_dir="/tmp")
        # repetitive enough that grpc-core really compresses it
        req = k.create_container_request(pod, ContainerSpec(name="c", envs={f"V{i}": "same" * 20 for i in range(200)}))
        answer = k.channel.unary_unary(CREATE_CONTAINER)(req.SerializeToString(), compression=grpc.Compression.Gzip,
                                                          timeout=10)
    assert answer == b"\x0a\x04fake"
    got = k.m.CreateContainerRequest.FromString(fake_runtime.last(CREATE_CONTAINER).request)
    env = {e.key: e.value for e in got.config.envs}
    assert env[names.NVIDIA_VISIBLE_DEVICES] == b"void"
    assert len(env) == 201
