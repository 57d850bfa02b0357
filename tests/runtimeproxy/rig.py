"""A proxy started in-process for a test, with its own sockets and hook config directory."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry

from runtimeproxy import cri_calls
from runtimeproxy.call_specs import CallSpecs
from runtimeproxy.config import ProxyConfig
from runtimeproxy.server import ProxyThread
from tests.runtimeproxy.kubelet import Kubelet


@dataclass
class ProxyRig:
    backend: str
    base_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="fgpu-proxy-", dir="/tmp"))
    force_void: bool = True
    backend_dial_timeout_s: float = 2.0
    thread: ProxyThread | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    #: the intercepted calls: the proxy's own, or a test's registry with more
    calls: CallSpecs = cri_calls.SPECS

    @property
    def hook_dir(self) -> str:
        return os.path.join(self.base_dir, "hooks.d")

    @property
    def listen(self) -> str:
        return f"unix://{self.base_dir}/proxy.sock"

    def config(self) -> ProxyConfig:
        os.makedirs(self.hook_dir, exist_ok=True)
        return ProxyConfig(
            listen=self.listen,
            backend=self.backend,
            hook_config_dir=self.hook_dir,
            admin_listen=f"unix://{self.base_dir}/admin.sock",
            metrics_listen="",
            force_void=self.force_void,
            backend_dial_timeout_s=self.backend_dial_timeout_s,
            hook_refresh_s=0.1,
        )

    def start(self, **overrides: object) -> ProxyRig:
        self.thread = ProxyThread(
            replace(self.config(), **overrides), registry=self.registry, calls=self.calls  # type: ignore[arg-type]
        ).start()
        return self

    def reload_hooks(self) -> None:
        assert self.thread is not None
        self.thread.call(self.thread.proxy.refresh_hooks_now)

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None

    def kubelet(self) -> Kubelet:
        return Kubelet(self.listen, log_root=os.path.join(self.base_dir, "pods"))

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return value or 0.0
