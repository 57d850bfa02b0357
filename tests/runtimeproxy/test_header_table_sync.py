"""Issue 14, defect 2: a header block the relay drops still keeps both peers' HPACK tables in step.

The runtime's answer on a call the proxy refused, and kubelet's request on a
stream refused while the proxy drains, are read by the relay and not passed
on. Each test makes such a block add entries to its sender's dynamic table,
then has the sender refer to them by index: the receiver must decode what
the sender meant, with no COMPRESSION_ERROR and no lost connection.
"""

from __future__ import annotations

import h2.events

from apis import names
from tests.runtimeproxy.h2peers import (
    CREATE_CONTAINER,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    connect_pair,
    create_container_request,
    frame,
    grpc_frame,
    proxy_before_h2_runtime,
    pump,
    request,
    request_headers,
    respond,
    status_of,
)

ALLOCATION = '{"gpu":[{"minor":0,"id":"GPU-x","resources":{"koordinator.sh/gpu-core":"100"}}]}'
LATE = (b"x-late", b"indexed by a block the receiver never saw, " * 2 + b"then referred to")
GRPC_UNAVAILABLE = 14


def test_a_runtime_block_dropped_for_a_refused_call_leaves_kubelets_table_in_step() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):  # no hook registered: a GPU container is refused
        kubelet, rt = connect_pair(rig, runtime)
        gpu = create_container_request(annotations={names.DEVICE_ALLOCATED: ALLOCATION})
        refused = request(kubelet, CREATE_CONTAINER, grpc_frame(gpu))
        pump([kubelet, rt], lambda: kubelet.ended(refused) and rt.of(h2.events.StreamReset, refused),
             what="the refusal at kubelet and the reset at the runtime")
        assert status_of(kubelet, refused)[0] == GRPC_UNAVAILABLE

        # the runtime's answer crossed the relay's reset; it indexes a field the relay must not pass on
        late_answer = [(b":status", b"200"), (b"content-type", b"application/grpc"), LATE, (b"grpc-status", b"0")]
        rt.send_raw(frame(HEADERS, END_HEADERS | END_STREAM, refused, rt.conn.encoder.encode(late_answer)))
        for n in range(3):
            # each answer refers to the runtime's new entry by its index
            sid = request(kubelet, "/test.Echo/Unary", grpc_frame(b"ping %d" % n))
            pump([kubelet, rt], lambda sid=sid: rt.ended(sid), what="the call at the runtime")
            respond(rt, sid, b"pong %d" % n, extra=[LATE])
            pump([kubelet, rt], lambda sid=sid: kubelet.ended(sid), what="the answer at kubelet")
            assert LATE in kubelet.headers(sid)
            assert kubelet.body(sid)[5:] == b"pong %d" % n
        assert kubelet.error is None, kubelet.error
        assert kubelet.goaways == []
        assert LATE not in kubelet.headers(refused)


def test_a_request_block_dropped_while_draining_leaves_the_runtimes_table_in_step() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        open_call = request(kubelet, "/test.Echo/Unary", grpc_frame(b"part"), end=False)
        pump([kubelet, rt], lambda: rt.body(open_call), what="the open call at the runtime")
        assert rig.thread is not None
        stopped = rig.thread.stopping(grace=10)
        pump([kubelet, rt], lambda: (open_call, 0) in kubelet.goaways, what="the final GOAWAY")

        # a stream kubelet opens after the final GOAWAY is refused, and its block is not forwarded
        late = 2 + open_call
        block = kubelet.conn.encoder.encode([*request_headers("/test.Echo/Unary"), LATE])
        kubelet.send_raw(frame(HEADERS, END_HEADERS | END_STREAM, late, block))
        pump([kubelet, rt], lambda: kubelet.resets(late), what="the refusal of the late stream")
        assert kubelet.resets(late) == [0x7]  # REFUSED_STREAM: kubelet may retry it elsewhere

        # kubelet's trailers on the open call refer to the new entry by its index
        kubelet.send_raw(frame(HEADERS, END_HEADERS | END_STREAM, open_call, kubelet.conn.encoder.encode([LATE])))
        pump([kubelet, rt], lambda: rt.ended(open_call), what="kubelet's trailers at the runtime")
        assert LATE in rt.headers(open_call)
        assert rt.error is None, rt.error
        assert not rt.of(h2.events.RequestReceived, late)

        respond(rt, open_call, b"done")
        pump([kubelet, rt], lambda: kubelet.eof, what="the answer, then the connection's end")
        assert kubelet.body(open_call)[5:] == b"done"
        stopped.result(timeout=5)
