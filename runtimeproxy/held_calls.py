"""Intercepted calls: the held-back request goes to the handler, and its answer goes to the runtime or to kubelet."""

from __future__ import annotations

import asyncio
import logging
import time

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import Forward, Refuse
from runtimeproxy.flow_control import FlowControl
from runtimeproxy.grpc_framing import (
    GRPC_INTERNAL,
    GRPC_RESOURCE_EXHAUSTED,
    grpc_frame,
    grpc_message,
    trailers,
)
from runtimeproxy.relay_state import MAX_HELD_BYTES, Stream

log = logging.getLogger(__name__)

_HIJACKED_MEMORY = 1024


class HeldCalls(FlowControl):
    """Edits a held-back request through the handler and sends the result on, or refuses the call."""

    def _start_edit(self, st: Stream) -> None:
        if st.task is None and not st.closed:
            st.task = asyncio.get_running_loop().create_task(self._edit(st))

    async def _edit(self, st: Stream) -> None:
        body = bytes(st.body)
        message: bytes | Refuse = grpc_message(body)
        if st.oversized:
            message = Refuse(GRPC_RESOURCE_EXHAUSTED, f"fgpu-runtime-proxy: request larger than {MAX_HELD_BYTES} bytes")
        outcome: Forward | Refuse
        if isinstance(message, Refuse):
            outcome = message
        else:
            try:
                outcome = await self.handler.edit(st.path, message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("intercepting %s failed", st.path.decode(errors="replace"))
                outcome = Refuse(GRPC_INTERNAL, f"fgpu-runtime-proxy: intercepting {st.path.decode(errors='replace')} failed: {exc}")
        if st.closed or self.closing or self.backend is None:
            return
        if isinstance(outcome, Refuse):
            self._hijack(st, outcome)
            return
        payload = body if outcome.message is None else grpc_frame(outcome.message)
        st.settled = True
        # kubelet was credited when the relay took its bytes; what the runtime returns for these is not kubelet's
        self.withhold += len(payload)
        st.pending = memoryview(payload)
        self._send_pending(st)
        if st.pending is not None:
            self.blocked.append(st)

    def _hijack(self, st: Stream, refusal: Refuse) -> None:
        assert self.backend is not None
        self.streams.pop(st.sid, None)
        self._abandon(st)
        self.hijacked[st.sid] = None
        if len(self.hijacked) > _HIJACKED_MEMORY:
            del self.hijacked[next(iter(self.hijacked))]
        self.backend.write(h2.rst_stream(st.sid, h2.CANCEL))
        self.client.write(trailers(st.sid, refusal.code, refusal.message))
        self.handler.finished(st.path, st.kind, bytes(st.body[5:]), refusal.code, time.perf_counter() - st.t0)
