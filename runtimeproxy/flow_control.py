"""Flow control toward the runtime: its windows, DATA queued while they are short, credit withheld from kubelet."""

from __future__ import annotations

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.relay_state import ConnectionState, Stream


class FlowControl(ConnectionState):
    """The flow-control bookkeeping of a `Connection`, over the windows `ConnectionState` holds."""

    def _abandon(self, st: Stream) -> None:
        """The call ended before its held-back request fully reached the runtime: stop, settle credit."""
        st.closed = True
        if st.kind is not StreamKind.EDIT:
            return
        if st.task is not None and not st.task.done():
            st.task.cancel()
        if st.settled and st.pending is not None:
            # never sent, so the runtime will not return credit for it: stop withholding that much
            self.withhold = max(0, self.withhold - len(st.pending))
        st.pending = None
        if st in self.blocked:
            self.blocked.remove(st)

    def _send_pending(self, st: Stream) -> None:
        assert self.backend is not None
        pending = st.pending
        if pending is None:
            return
        if not pending:
            self.backend.write(h2.frame(h2.DATA, h2.END_STREAM, st.sid))
            st.pending = None
            return
        out = bytearray()
        while pending and not self.queue:
            n = min(len(pending), st.window, self.bwin, self.b_max_frame)
            if n <= 0:
                break
            chunk = pending[:n]
            pending = pending[n:]
            st.window -= n
            self.bwin -= n
            out += h2.frame(h2.DATA, 0 if pending else h2.END_STREAM, st.sid, bytes(chunk))
        if out:
            self.backend.write(bytes(out))
        st.pending = pending if pending else None

    def _backend_settings(self, values: dict[int, int]) -> None:
        if h2.SETTINGS_INITIAL_WINDOW_SIZE in values:
            new = values[h2.SETTINGS_INITIAL_WINDOW_SIZE]
            diff = new - self.b_initial_window
            self.b_initial_window = new
            # RFC 9113 moves open streams' windows by the difference, but a grpc-core runtime that
            # raised its initial window (BDP probing) was seen to reset, with PROTOCOL_ERROR, a
            # held-back stream that used the difference (test_relay.py, 4x5MB). Only a decrease is
            # applied; the runtime grants more with stream WINDOW_UPDATEs as it reads.
            if diff < 0:
                for st in self.streams.values():
                    if st.kind is StreamKind.EDIT:
                        st.window += diff
        if h2.SETTINGS_MAX_FRAME_SIZE in values:
            self.b_max_frame = values[h2.SETTINGS_MAX_FRAME_SIZE]
        self._drain()

    def _drain(self) -> None:
        if self.backend is None:
            return
        while self.queue and self.bwin >= self.queue[0][1]:
            frame_bytes, length = self.queue.popleft()
            self.bwin -= length
            self.backend.write(frame_bytes)
        if self.blocked and not self.queue:
            for st in list(self.blocked):
                self._send_pending(st)
                if st.pending is None:
                    self.blocked.remove(st)
