"""Intercepted calls: the held-back request goes to the handler, and its answer goes to the runtime or to kubelet.

A compressed request (`grpc-encoding: gzip` or `deflate`, flag set) is
decompressed for the handler, and an edited message is compressed again the
same way, flag set, so the runtime reads it under the headers kubelet sent.
"""

from __future__ import annotations

import asyncio
import logging
import time

from runtimeproxy import flow_control, grpc_framing, header_sync
from runtimeproxy import h2frames as h2
from runtimeproxy.calls import Forward, Refuse
from runtimeproxy.grpc_framing import GRPC_INTERNAL, GRPC_RESOURCE_EXHAUSTED
from runtimeproxy.relay_state import MAX_HELD_BYTES, ConnectionState, Stream, remember

log = logging.getLogger(__name__)


def start_edit(conn: ConnectionState, st: Stream) -> None:
    """kubelet sent the whole request: hand it to the handler (once)."""
    if st.task is None and not st.closed:
        st.task = asyncio.get_running_loop().create_task(_edit(conn, st))


async def _edit(conn: ConnectionState, st: Stream) -> None:
    body = bytes(st.body)
    message: bytes | Refuse = grpc_framing.grpc_message(body, st.encoding)
    if st.oversized:
        message = Refuse(GRPC_RESOURCE_EXHAUSTED, f"fgpu-runtime-proxy: request larger than {MAX_HELD_BYTES} bytes")
    outcome: Forward | Refuse
    if isinstance(message, Refuse):
        outcome = message
    else:
        try:
            outcome = await conn.handler.edit(st.path, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("intercepting %s failed", st.path.decode(errors="replace"))
            outcome = Refuse(GRPC_INTERNAL, f"fgpu-runtime-proxy: intercepting {st.path.decode(errors='replace')} failed: {exc}")
    if st.closed or conn.closing or conn.backend is None:
        return
    if isinstance(outcome, Refuse):
        hijack(conn, st, outcome, None if isinstance(message, Refuse) else message)
        return
    if outcome.message is None:
        payload = body
    else:
        # compressed as kubelet compressed it: the runtime reads it under kubelet's grpc-encoding header
        payload = grpc_framing.grpc_frame(outcome.message, st.encoding if grpc_framing.is_compressed(body) else b"")
    flow_control.send(conn, st, payload)


def hijack(conn: ConnectionState, st: Stream, refusal: Refuse, message: bytes | None) -> None:
    """Answers kubelet with the refusal and resets the runtime's half, whose late frames are then dropped."""
    assert conn.backend is not None
    conn.streams.pop(st.sid, None)
    flow_control.abandon(conn, st)
    remember(conn.hijacked, st.sid)
    conn.backend.write(h2.rst_stream(st.sid, h2.CANCEL))
    conn.client.write(header_sync.trailers(conn.resp, st.sid, refusal.code, refusal.message, headers_sent=st.responded))
    conn.handler.finished(st.path, st.kind, message, refusal.code, time.perf_counter() - st.t0)
