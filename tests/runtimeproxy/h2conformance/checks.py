"""What every case checks afterwards, on both peers: the connection works, windows agree, others are untouched."""

from __future__ import annotations

import h2.events
from h2.stream import StreamState

from apis.cri.v1 import runtime_partial_pb2 as cri
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import RST_STREAM, Pair, Peer, RawFrame
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

OPEN = StreamState.OPEN


def windows_agree(pair: Pair, *, in_transit: int = 0) -> None:
    """With every frame delivered, each sender's send window is the receiver's receive window (connection
    level, and per stream for streams both still have open), once each receiver returned all it owes: credit
    a lazy peer held back, and what h2 keeps for DATA that arrived on a stream it had reset.

    `in_transit`: the bytes of edited requests the proxy may still be sending (see below)."""
    assert pair.barrier(), f"the connection ended:\n{pair.client.describe()}\n{pair.runtime.describe()}"
    for peer in pair.peers:
        peer.settle_credit()
    assert pair.barrier(), f"the connection ended:\n{pair.client.describe()}\n{pair.runtime.describe()}"
    c, r = pair.client.conn, pair.runtime.conn
    # The proxy grants kubelet credit for a held request itself and holds back as much of what the runtime
    # returns, so while an edited request is still on its way (`in_transit` bytes at most), kubelet's window
    # may be smaller than the runtime's by up to that much; never larger.
    gap = r.inbound_flow_control_window - c.outbound_flow_control_window
    assert 0 <= gap <= in_transit, f"kubelet -> runtime connection window: the proxy holds back {gap} bytes of credit"
    assert r.outbound_flow_control_window == c.inbound_flow_control_window, "runtime -> kubelet connection window"
    for sid, stream in c.streams.items():
        other = r.streams.get(sid)
        # only where both ends may still send (a half-closed stream's window no longer moves both ways)
        if other is not None and stream.state_machine.state is OPEN and other.state_machine.state is OPEN:
            assert stream.outbound_flow_control_window == other.inbound_flow_control_window, f"stream {sid} ->"
            assert other.outbound_flow_control_window == stream.inbound_flow_control_window, f"stream {sid} <-"


def connection_works(pair: Pair) -> None:
    """Both peers error-free, a pass-through and an intercepted call complete (HPACK in step both ways, which
    `roundtrip` checks header by header), and the windows agree."""
    assert pair.client.error is None and pair.runtime.error is None, (pair.client.error, pair.runtime.error)
    g.roundtrip(pair)
    got, _ = g.roundtrip(pair, g.CREATE_CONTAINER, g.create_request(), g.CREATE_RESPONSE)
    assert voided(got.message)
    g.roundtrip(pair, g.UNKNOWN, b"still here", b"still here")
    windows_agree(pair)


def others_work(proxy: ProxyProcess) -> None:
    """A new kubelet connection through the same proxy completes its calls."""
    pair = proxy.connect(suffix="-other")
    connection_works(pair)
    pair.close()


def voided(message: bytes) -> bool:
    """The runtime got the CreateContainer as the proxy edits it when no hook sets GPUs."""
    req = cri.CreateContainerRequest.FromString(message)
    return any(e.key == "NVIDIA_VISIBLE_DEVICES" and e.value == b"void" for e in req.config.envs)


def held_create(pair: Pair, gate: Gate, *, env_bytes: int = 0) -> int:
    """An intercepted CreateContainer sent whole and now held by the proxy while the hook has it."""
    client = pair.client
    sid = g.request(client, g.CREATE_CONTAINER, b"", end=False)
    g.send_all(pair, client, sid, g.grpc_frame(g.create_request(env_bytes=env_bytes)))
    gate.wait_entered(pair)
    # the proxy forwards a held call's headers at once; the runtime has read them too
    pair.pump(lambda: pair.runtime.of(h2.events.RequestReceived, sid), what="the held call's headers at the runtime")
    return sid


def answered_by_the_proxy(pair: Pair, sender: Peer, offending: RawFrame, codes: tuple[int, ...], *,
                         stream_error: bool = False, timeout: float = 2.0) -> None:
    """`sender` broke the protocol with `offending`: it gets one of `codes` (GOAWAY; or RST_STREAM on that stream
    for a stream error), the other peer never receives the offending frame and sees no protocol error of its
    own, and where the connection ended the other peer's connection ended too."""
    other = pair.runtime if sender is pair.client else pair.client

    def reached() -> bool:
        if any(f.error_code in codes for f in sender.goaways):
            return True
        return stream_error and any(f.error_code in codes for f in sender.frames_of(RST_STREAM, offending.stream_id))

    pair.pump(lambda: reached() or sender.eof, timeout=timeout, what=f"error {codes} at {sender.name}")
    assert reached(), f"{sender.name} got no error {codes}: {sender.describe()}"
    assert offending not in other.frames, f"{other.name} received the offending frame {offending}"
    assert other.error is None, f"{other.name} saw a protocol error: {other.error!r}"
    if any(f.error_code in codes for f in sender.goaways):
        pair.pump(lambda: other.eof or other.goaways, timeout=timeout, what=f"the end of {other.name}'s connection")


def error_reached(pair: Pair, sender: Peer, code: int, *, stream_id: int | None = None, timeout: float = 2.0) -> None:
    """`sender` broke the protocol: it gets `code` (GOAWAY, or RST_STREAM on `stream_id`), from the proxy or
    from the other peer through it, and where the connection ended the other peer's connection ended too."""
    other = pair.runtime if sender is pair.client else pair.client

    def reached() -> bool:
        if any(f.error_code == code for f in sender.goaways):
            return True
        return stream_id is not None and any(f.error_code == code for f in sender.frames_of(RST_STREAM, stream_id))

    pair.pump(lambda: reached() or sender.eof, timeout=timeout, what=f"error {code} at {sender.name}")
    assert reached(), f"{sender.name} got no error {code}: {sender.describe()}"
    if any(f.error_code == code for f in sender.goaways):
        pair.pump(lambda: other.eof or other.goaways or other.error, timeout=timeout,
                  what=f"the end of {other.name}'s connection")
