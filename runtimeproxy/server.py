"""The proxy daemon: listener, relay, hooks, admin socket and metrics endpoint, with start() and stop(grace)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, start_http_server
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from apis import grpc_server, hostport, names
from runtimeproxy import compiled, cri_calls
from runtimeproxy.backend_health import BackendHealth
from runtimeproxy.call_specs import CallSpecs
from runtimeproxy.config import ProxyConfig
from runtimeproxy.hookclient import HookClient
from runtimeproxy.hookconfig import HookRegistry
from runtimeproxy.interception import HookedCalls
from runtimeproxy.logs import event
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.relay import Dialer, Relay
from runtimeproxy.runtime_client import RuntimeClient

log = logging.getLogger(__name__)

#: The runtime's services, whose health the admin socket reports (it serves neither).
CRI_SERVICES = (names.CRI_RUNTIME_SERVICE, names.CRI_IMAGE_SERVICE)
#: asyncio's own default; kubelet opens a handful of connections
LISTEN_BACKLOG = 100


def make_connector(config: ProxyConfig) -> Dialer:
    """Dials the runtime once, for at most backend_dial_timeout_s (a TCP connect can hang; a unix one cannot)."""
    addr = grpc_server.parse_address(config.backend, field="backend")

    async def connect(factory: Callable[[], asyncio.BaseProtocol]) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(config.backend_dial_timeout_s):
            if addr.unix_path is not None:
                transport, _ = await loop.create_unix_connection(factory, addr.unix_path)
            else:
                assert addr.hostport is not None
                host, port = hostport.split(addr.hostport)
                transport, _ = await loop.create_connection(factory, host, port)
        return transport

    return connect


def make_dialer(config: ProxyConfig) -> Dialer:
    """Dials the runtime, retrying with backoff for up to backend_dial_timeout_s (containerd restarting)."""
    connect = make_connector(config)

    async def dial(factory: Callable[[], asyncio.BaseProtocol]) -> asyncio.Transport:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(config.backend_dial_timeout_s),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type(OSError),
            reraise=True,
        ):
            with attempt:
                return await connect(factory)
        raise AssertionError("unreachable")

    return dial


def make_probe(config: ProxyConfig) -> Callable[[], Awaitable[None]]:
    """One dial of the runtime, closed at once: raises OSError when it cannot be reached.

    It sends nothing; containerd's gRPC server drops a connection that closes before the HTTP/2
    preface without a log line.
    """
    connect = make_connector(config)

    async def probe() -> None:
        transport = await connect(asyncio.Protocol)
        transport.close()

    return probe


class RuntimeProxy:
    """One proxy instance. Run it in an event loop: `await start()`, later `await stop(grace)`.

    `calls` are the intercepted CRI calls (the proxy's own, `cri_calls.SPECS`, unless a test adds some).
    """

    def __init__(
        self, config: ProxyConfig, *, registry: CollectorRegistry | None = None, calls: CallSpecs = cri_calls.SPECS
    ) -> None:
        self.config = config
        self.calls = calls
        self.metrics = ProxyMetrics(registry)
        self.hook_registry = HookRegistry(config.hook_config_dir, stages=calls.stages)
        self.hooks: HookClient | None = None
        self.runtime: RuntimeClient | None = None
        self.handler: HookedCalls | None = None
        self.relay: Relay | None = None
        self._server: asyncio.Server | None = None
        self._admin: grpc.Server | None = None
        self._health: Any = None
        self.backend_health: BackendHealth | None = None
        self._http: Any = None
        self._refresher: asyncio.Task[None] | None = None
        self._socket_id: tuple[int, int] | None = None
        self._admin_socket_id: tuple[int, int] | None = None
        self._stopping = False
        self.metrics_port: int | None = None

    async def start(self) -> None:
        cfg = self.config
        self.hooks = HookClient(metrics=self.metrics)
        self.runtime = RuntimeClient(cfg.backend, timeout_s=cfg.lookup_timeout_s)
        self.handler = HookedCalls(
            registry=self.hook_registry, hooks=self.hooks, runtime=self.runtime, metrics=self.metrics,
            force_void=cfg.force_void, hook_server_namespaces=cfg.hook_server_namespaces, specs=self.calls,
        )
        self.relay = Relay(
            dial=make_dialer(cfg), handler=self.handler, backend_name=cfg.backend,
            on_backend_connect=self._backend_connect, on_backend_lost=self._backend_lost,
        )
        loop = asyncio.get_running_loop()
        addr = grpc_server.parse_address(cfg.listen, field="listen")
        if addr.unix_path is not None:
            # Bound here, under the lock, so no await runs while the lock is held.
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with grpc_server.socket_path_lock(addr.unix_path):
                    grpc_server.prepare_unix_socket(addr.unix_path)
                    listener.bind(addr.unix_path)
                    # Listening before the path is visible unlocked: a client that waits for the
                    # socket file must not find it refusing connections.
                    listener.listen(LISTEN_BACKLOG)
                    st = os.stat(addr.unix_path)
                    self._socket_id = (st.st_dev, st.st_ino)
            except BaseException:
                listener.close()
                raise
            self._server = await loop.create_unix_server(self.relay.protocol, sock=listener, backlog=LISTEN_BACKLOG)
            grpc_server.finish_unix_socket(addr.unix_path, mode=cfg.socket_mode, group=cfg.socket_gid())
        else:
            assert addr.hostport is not None
            host, port = hostport.split(addr.hostport)
            self._server = await loop.create_server(self.relay.protocol, host, port)
        if cfg.admin_listen:
            self._start_admin(cfg.admin_listen)
        if cfg.metrics_listen:
            host, port = hostport.split(cfg.metrics_listen)
            self._http, _ = start_http_server(port, addr=host, registry=self.metrics.registry)
            self.metrics_port = self._http.server_port
        self._refresher = loop.create_task(self._refresh_hooks())
        event(
            log, logging.INFO, "runtime proxy serving", listen=cfg.listen, backend=cfg.backend,
            hook_config_dir=cfg.hook_config_dir, admin=cfg.admin_listen, metrics=cfg.metrics_listen,
            hook_servers=",".join(s.name for s in self.hook_registry.servers()),
            relay_build=compiled.build, event_loop=type(loop).__module__.split(".")[0],
        )

    def _start_admin(self, address: str) -> None:
        self._admin = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="admin"))
        # The admin socket serves health and reflection only: reflection lists those, while health
        # also reports on the runtime's CRI services (NOT_SERVING until a dial of it worked).
        self._health = grpc_server.add_health_and_reflection(self._admin, [], reported=CRI_SERVICES)
        addr = grpc_server.parse_address(address, field="admin-listen")
        if addr.unix_path is None:
            grpc_server.add_listener(self._admin, address, field="admin-listen")
            self._admin.start()
        else:
            # grpc-core unlinks a unix listener's path when the server stops, and by then a successor
            # may have bound that path. So grpc binds a name of this process's own, renamed into place:
            # grpc's unlink then finds nothing, and stop() removes the path only while it is ours.
            # random, not the pid: a successor in another container may have the same pid; in the same
            # directory (rename stays on one filesystem) and short (unix socket paths end at 107 bytes)
            private = os.path.join(os.path.dirname(addr.unix_path), f".fgpu-{os.urandom(4).hex()}")
            grpc_server.add_listener(self._admin, f"unix://{private}", field="admin-listen")
            self._admin.start()
            try:
                with grpc_server.socket_path_lock(addr.unix_path):
                    grpc_server.prepare_unix_socket(addr.unix_path)
                    os.rename(private, addr.unix_path)
                    st = os.lstat(addr.unix_path)
                    self._admin_socket_id = (st.st_dev, st.st_ino)
            except BaseException:
                self._admin.stop(grace=None)  # grpc removes the private name
                raise
        self.backend_health = BackendHealth(
            probe=make_probe(self.config), report=self._report_backend, backend_name=self.config.backend
        )
        self.backend_health.start()

    def _backend_connect(self, ok: bool) -> None:
        self.metrics.backend_dials.labels("ok" if ok else "failed").inc()
        if self.backend_health is not None:
            self.backend_health.dialled(ok)

    def _backend_lost(self) -> None:
        if self.backend_health is not None and not self._stopping:
            self.backend_health.lost()

    def _report_backend(self, reachable: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if reachable else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in CRI_SERVICES:
            self._health.set(service, status)

    async def _refresh_hooks(self) -> None:
        while True:
            await asyncio.sleep(self.config.hook_refresh_s)
            try:
                if self.hook_registry.refresh() and self.hooks is not None:
                    await self.hooks.forget_others({s.endpoint for s in self.hook_registry.servers()})
            except Exception:
                log.exception("reading the hook config directory failed")

    async def stop(self, grace: float = 5.0) -> None:
        """Stops accepting, drains every connection (GOAWAY, open calls finish for up to `grace` s), closes all.

        The listening socket goes first, so that a successor (systemd's restart) can bind the
        path while this one still finishes its calls, and kubelet reconnects to it.
        """
        if self._stopping:
            return
        self._stopping = True
        if self._server is not None:
            self._server.close()
        self._release_socket()
        if self._refresher is not None:
            self._refresher.cancel()
        if self.relay is not None:
            await self.relay.shutdown(grace)
        if self.handler is not None:
            for task in list(self.handler.background):
                task.cancel()
        if self.backend_health is not None:
            await self.backend_health.close()
        if self._admin is not None:
            if self.config.admin_listen:
                self._release_path(self.config.admin_listen, self._admin_socket_id)
                self._admin_socket_id = None
            self._admin.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self.hooks is not None:
            await self.hooks.close()
        if self.runtime is not None:
            await self.runtime.close()
        event(log, logging.INFO, "runtime proxy stopped")

    def _release_socket(self) -> None:
        """Removes the listen socket, unless it is no longer ours (a successor already bound the path)."""
        self._release_path(self.config.listen, self._socket_id)
        self._socket_id = None

    @staticmethod
    def _release_path(address: str, socket_id: tuple[int, int] | None) -> None:
        """Removes the unix socket at `address` if it is still the one we bound (`socket_id`)."""
        addr = grpc_server.parse_address(address, field="listen")
        if addr.unix_path is None or socket_id is None:
            return
        with grpc_server.socket_path_lock(addr.unix_path), contextlib.suppress(FileNotFoundError):
            st = os.lstat(addr.unix_path)
            if (st.st_dev, st.st_ino) == socket_id:
                os.unlink(addr.unix_path)

    def refresh_hooks_now(self) -> None:
        self.hook_registry.refresh()


class ProxyThread:
    """Runs a RuntimeProxy on its own event loop in a background thread (tests, demos)."""

    def __init__(
        self, config: ProxyConfig, *, registry: CollectorRegistry | None = None, calls: CallSpecs = cri_calls.SPECS
    ) -> None:
        self.proxy = RuntimeProxy(config, registry=registry, calls=calls)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="runtime-proxy", daemon=True)

    def start(self) -> ProxyThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(timeout=30)
        return self

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` on the proxy's loop and returns its result."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def stopping(self, grace: float = 1.0) -> concurrent.futures.Future[None]:
        """Starts `stop(grace)` on the proxy's loop and returns at once (tests drive peers meanwhile)."""
        return asyncio.run_coroutine_threadsafe(self.proxy.stop(grace), self._loop)

    def stop(self, grace: float = 1.0) -> None:
        if not self._thread.is_alive():
            return
        self.stopping(grace).result(timeout=grace + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
