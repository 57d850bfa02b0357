"""One kubelet connection and the runtime connection paired with it: dialling, and either side going away.

The frames themselves go through `request_pump` (kubelet -> runtime) and
`response_pump` (runtime -> kubelet), both over the state `Connection` is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from runtimeproxy import peer_errors, refusal, request_pump, response_pump
from runtimeproxy.relay_state import ConnectionState, ReadBuffer, RelayContext, Transport

log = logging.getLogger(__name__)


class _BackendSide(asyncio.BufferedProtocol):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._reads = ReadBuffer()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reads.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        response_pump.pump(self.conn, self._reads.take(nbytes))

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.backend_lost(exc)

    def pause_writing(self) -> None:
        self.conn.client.pause_reading()

    def resume_writing(self) -> None:
        self.conn.client.resume_reading()


class Connection(ConnectionState):
    """One kubelet connection and the runtime connection paired with it."""

    def __init__(
        self, relay: RelayContext, client: Transport, *, on_backend_lost: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__(relay, client)
        self._on_backend_lost = on_backend_lost
        self.dial_task = asyncio.get_running_loop().create_task(self._dial())

    # --- lifecycle --------------------------------------------------------------------------------

    async def _dial(self) -> None:
        try:
            transport = await self.relay.dial(lambda: _BackendSide(self))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.relay.on_backend_connect(False)
            log.warning("backend unreachable backend=%s error=%r", self.relay.backend_name, str(exc))
            refusal.refuse_all(self, f"fgpu-runtime-proxy: the container runtime at {self.relay.backend_name} is unreachable: {exc}")
            return
        finally:
            self.dial_task = None
        self.relay.on_backend_connect(True)
        if self.closing:
            transport.close()
            return
        self.set_backend(transport)
        if self.cbuf:
            data, self.cbuf = self.cbuf, b""
            request_pump.pump(self, data)

    def client_lost(self) -> None:
        self.close()

    def backend_lost(self, exc: Exception | None) -> None:
        if self.closing:
            # Closing already; if because the runtime said GOAWAY (it is stopping), its going is news.
            if self.runtime_goaway_sid is not None:
                self._on_backend_lost()
            return
        # The runtime went away (restart, crash): finish kubelet's open calls with a clear
        # status and let it reconnect; the next connection dials the runtime afresh.
        peer_errors.fail_open_calls(
            self, f"fgpu-runtime-proxy: lost the connection to the container runtime at {self.relay.backend_name}"
        )
        self.close()
        self._on_backend_lost()
