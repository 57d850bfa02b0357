"""An intercepted call sent compressed (`grpc-encoding: gzip`): nothing in the CRI forbids it."""

from __future__ import annotations

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.rig import ProxyProcess


def test_a_compressed_create_container_is_edited_and_forwarded(proxy: ProxyProcess) -> None:
    """Issue 14 defect 5: the relay before #14 refused it as UNIMPLEMENTED."""
    pair = proxy.connect()
    sid = g.request(pair.client, g.CREATE_CONTAINER, g.create_request(env_bytes=5000), compressed=True)
    got = g.await_request(pair, sid)  # decompressed here when the proxy forwards it compressed
    assert checks.voided(got.message)
    assert (b"grpc-encoding", b"gzip") in got.headers
    g.respond(pair.runtime, sid, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE
    checks.connection_works(pair)
