"""Seeding the API double and starting scheduler apps against it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from apis.devices import NodeDevices, to_device_object
from scheduler_plugin.app import SchedulerApp, Timing
from scheduler_plugin.config import LeaderElectionConfig, SchedulerConfig, StateBackend
from tests.kubeapi.server import DEVICE_CRD, KubeAPIServer

DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
FAST = Timing(watch_timeout_s=5, tick_s=0.2, standalone_idle_s=0.05)


def install(api: KubeAPIServer) -> None:
    api.install_crd(DEVICE_CRD)


def add_node(api: KubeAPIServer, devices: NodeDevices, *, labels: dict[str, str] | None = None, cpu: str = "64", memory: str = "512Gi") -> None:
    node = api.put_object(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": devices.node_name, "labels": {"kubernetes.io/hostname": devices.node_name, **(labels or {})}},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}, "capacity": {"cpu": cpu, "memory": memory}},
        },
    )
    api.put_object(DEVICES, to_device_object(devices, node_uid=node["metadata"]["uid"]))


def add_pod(api: KubeAPIServer, pod: dict[str, Any]) -> dict[str, Any]:
    namespace = pod["metadata"].get("namespace", "default")
    return api.put_object(f"/api/v1/namespaces/{namespace}/pods", pod)


def get_pod(api: KubeAPIServer, name: str, namespace: str = "default") -> dict[str, Any]:
    obj = api.get_object(f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert obj is not None, f"pod {namespace}/{name} missing"
    return obj


def config(
    api: KubeAPIServer,
    key_file: str,
    *,
    standalone: bool = False,
    grpc_listen: str = "",
    extender_listen: str = "",
    lease_s: float = 2.0,
    policy: str = "",
) -> SchedulerConfig:
    """A scheduler on the API double; `policy` empty keeps the product's default."""
    return SchedulerConfig(
        **({"policy": policy} if policy else {}),
        state=StateBackend.KUBERNETES,
        kubeconfig=api.kubeconfig_path,
        grpc_listen=grpc_listen,
        extender_listen=extender_listen,
        standalone=standalone,
        signing_key=key_file,
        leader_election=LeaderElectionConfig(
            enabled=True,
            namespace="kube-system",
            lease_duration_s=lease_s,
            renew_deadline_s=lease_s * 0.6,
            retry_period_s=lease_s * 0.1,
        ),
    )


def start(cfg: SchedulerConfig, *, identity: str = "") -> SchedulerApp:
    app = SchedulerApp(cfg, identity=identity or None, timing=FAST)
    app.start()
    return app


def eventually(check: Callable[[], bool], *, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
