"""Held-out HTTP/2 review of the runtime proxy's frame relay: what valid peers do that the conformance suite
(tests/runtimeproxy/h2conformance) does not try, driven with its rig and `h2` peers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import h2.events
import h2.settings
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import conftest as conformance
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import HEADERS, Credit, Peer, pump, settings_acked
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess
from tests.runtimeproxy.hookserver import TestHookServer

S = h2.settings.SettingCodes

# the conformance suite's fixtures (one proxy process and hook server, checked after each test), shared here
h2_hook, h2_proxy, hook, gate, proxy = (
    conformance.h2_hook, conformance.h2_proxy, conformance.hook, conformance.gate, conformance.proxy,
)


def _first_block_after(peer: Peer, mark: int) -> bytes:
    """The header block fragment of the first HEADERS frame `peer` received after its `mark`-th frame."""
    blocks = [f.payload for f in peer.frames[mark:] if f.type == HEADERS]
    assert blocks, f"{peer.name} received no header block"
    return blocks[0]


def _size_update(block: bytes) -> int | None:
    """The value of the dynamic table size update the block starts with (RFC 7541 6.3), if it does."""
    if not block or block[0] & 0xE0 != 0x20:
        return None
    value = block[0] & 0x1F
    if value < 0x1F:
        return value
    shift, pos = 0, 1
    while True:
        value += (block[pos] & 0x7F) << shift
        shift += 7
        pos += 1
        if not block[pos - 1] & 0x80:
            return value


@pytest.mark.parametrize("sizes", [(0,), (256,), (0, 4096)], ids=["to-0", "to-256", "to-0-and-back"])
def test_a_refusal_after_kubelet_lowered_its_header_table_starts_with_the_size_update_kubelet_is_owed(
    proxy: ProxyProcess, gate: Gate, sizes: tuple[int, ...]
) -> None:
    """RFC 7541 4.2: once kubelet's smaller SETTINGS_HEADER_TABLE_SIZE is acknowledged, the next header block it
    gets must start with a size update no larger than the smallest size. The runtime's encoder owes it, but here
    the proxy's own trailers (a refused held call) come first; without the update h2 fails the whole connection
    ("Encoder did not shrink table size to within the max") and nghttp2 rejects even the 0-and-back case."""
    gate.reject = "refused after the table shrank"
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    for _ in range(3):  # entries in the runtime's table, which kubelet's table mirrors
        g.roundtrip(pair)
    sid = checks.held_create(pair, gate)
    for size in sizes:
        client.conn.update_settings({S.HEADER_TABLE_SIZE: size})
        client.flush()
    pair.pump(settings_acked(client, 1 + len(sizes)), what="the runtime's ACKs at kubelet")
    mark = len(client.frames)
    gate.open()
    pair.pump(lambda: client.ended(sid) or client.dead, what="the proxy's refusal at kubelet")
    assert client.error is None, client.error
    assert g.await_answer(pair, sid).status == 9
    update = _size_update(_first_block_after(client, mark))
    assert update is not None and update <= min(sizes), update
    gate.reject = ""
    # the runtime's own update follows in its next block; all three tables stay in step
    checks.connection_works(pair)
    assert client.conn.decoder.header_table_size == runtime.conn.encoder.header_table_size


def test_a_refusal_after_the_table_size_changed_keeps_a_re_encoded_direction_in_step(
    proxy: ProxyProcess, gate: Gate
) -> None:
    """The same once the relay re-encodes the runtime's blocks (a dropped block changed the runtime's table)."""
    gate.reject = "refused"
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    g.roundtrip(pair)
    sid = checks.held_create(pair, gate)
    runtime.conn.send_headers(sid, [*g.RESPONSE_HEADERS, (b"x-early", b"dropped with the refused call")])
    gate.open()
    pair.pump(lambda: client.ended(sid), what="the first refusal")
    runtime.flush()  # dropped by the proxy: from here on it re-encodes the runtime's blocks for kubelet
    assert pair.barrier()
    gate.reject, gate.opened = "refused again", type(gate.opened)()
    sid = checks.held_create(pair, gate)
    client.conn.update_settings({S.HEADER_TABLE_SIZE: 0})
    client.flush()
    pair.pump(settings_acked(client, 2), what="the runtime's ACK at kubelet")
    mark = len(client.frames)
    gate.open()
    pair.pump(lambda: client.ended(sid) or client.dead, what="the second refusal")
    assert client.error is None, client.error
    assert _size_update(_first_block_after(client, mark)) == 0
    gate.reject = ""
    checks.connection_works(pair)


def _more_than(runtime: Peer, sid: int, received: int) -> Callable[[], bool]:
    """The runtime has more than `received` bytes of the stream's request, or the whole of it."""
    return lambda: len(runtime.body(sid)) > received or g.request_done(runtime, sid) or runtime.dead


@pytest.fixture
def runtimeless_proxy(hook: TestHookServer) -> Iterator[ProxyProcess]:
    """A proxy of its own whose runtime socket nobody listens on."""
    own = ProxyProcess(tempfile.mkdtemp(prefix="fgpu-h2-review-", dir="/tmp"), hook_endpoint=hook.endpoint)
    own.start()
    own.listener.close()
    os.unlink(own.backend_path)
    yield own
    for peer in own.peers:
        peer.close()
    own.stop()


def test_without_a_runtime_a_kubelet_with_a_small_header_table_gets_the_unavailable_answer(
    runtimeless_proxy: ProxyProcess,
) -> None:
    """The proxy answers as the whole server then; a client announcing HEADER_TABLE_SIZE 0 in its preface (nghttp
    -c 0) applies it when the proxy's ACK arrives, so the proxy's next block must shrink the table first."""
    client = runtimeless_proxy.dial()
    client.conn.update_settings({S.HEADER_TABLE_SIZE: 0})
    sid = g.request(client, g.VERSION, g.VERSION_REQUEST)
    pump([client], lambda: client.ended(sid) or client.dead, what="the proxy's answer")
    assert client.error is None, client.error
    assert client.of(h2.events.StreamEnded, sid)
    assert dict(client.headers(sid)[0])[b"grpc-status"] == b"14"


def test_a_runtime_that_opens_streams_at_window_0_and_grants_one_byte_at_a_time_gets_the_held_call(
    proxy: ProxyProcess, gate: Gate
) -> None:
    """SETTINGS_INITIAL_WINDOW_SIZE 0, then 1-byte WINDOW_UPDATEs (stream and connection). The relay used to keep
    the runtime's stream credit for an intercepted call to itself and gave kubelet credit only for DATA it had
    received: kubelet, at window 0, could never send the message, and the call hung."""
    pair = proxy.connect(runtime_credit=Credit.NONE, runtime_settings={S.INITIAL_WINDOW_SIZE: 0})
    client, runtime = pair.client, pair.runtime
    sid = g.request(client, g.CREATE_CONTAINER, b"", end=False)
    pair.pump(lambda: runtime.of(h2.events.RequestReceived, sid), what="the held call's headers at the runtime")
    assert client.conn.local_flow_control_window(sid) == 0

    def grant_one_byte() -> None:
        runtime.conn.increment_flow_control_window(1, sid)
        runtime.conn.increment_flow_control_window(1)
        runtime.flush()

    grant_one_byte()
    pair.pump(lambda: client.conn.local_flow_control_window(sid) > 0, what="the runtime's credit at kubelet")
    g.send_all(pair, client, sid, g.grpc_frame(g.create_request()))
    gate.wait_entered(pair)
    gate.open()
    while not g.request_done(runtime, sid) and not runtime.dead:
        received = len(runtime.body(sid))
        grant_one_byte()
        pair.pump(_more_than(runtime, sid, received), what=f"one more byte of the edited request after {received}")
    assert runtime.error is None, runtime.error
    assert checks.voided(g.await_request(pair, sid).message)
    g.respond(runtime, sid, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE
    assert client.error is None


@pytest.mark.parametrize("shrunk", [False, True], ids=["plain", "after-the-runtime-shrank-its-header-table"])
def test_a_held_request_that_kubelet_ends_with_trailers_reaches_the_runtime_message_first(
    proxy: ProxyProcess, gate: Gate, shrunk: bool
) -> None:
    """HTTP/2 lets a request end with a trailers block instead of END_STREAM on DATA (gRPC clients do not, other
    HTTP/2 clients may). For an intercepted call the runtime got the trailers, and with them the end of the
    request, before the message the proxy was still holding: an empty request, then DATA on a closed stream.
    `shrunk`: kubelet's trailers are its first block after the runtime's smaller table, so they carry the size
    update the runtime waits for, and the trailers the proxy writes later must too."""
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    g.roundtrip(pair)
    sid = g.request(client, g.CREATE_CONTAINER, b"", end=False)
    if shrunk:
        runtime.conn.update_settings({S.HEADER_TABLE_SIZE: 0})
        runtime.flush()
        pair.pump(settings_acked(runtime, 2), what="kubelet's ACK at the runtime")
    g.send_body(client, sid, g.grpc_frame(g.create_request()), end=False)
    client.conn.send_headers(sid, [(b"x-request-trailer", b"t")], end_stream=True)
    client.flush()
    gate.wait_entered(pair)
    gate.open()
    got = g.await_request(pair, sid)
    assert checks.voided(got.message)
    assert runtime.headers(sid)[-1] == [(b"x-request-trailer", b"t")]
    assert runtime.error is None
    g.respond(runtime, sid, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE
    checks.connection_works(pair)
