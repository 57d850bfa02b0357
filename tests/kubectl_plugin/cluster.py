"""A small cluster in the API double for top and the plugin: two GPU nodes' agents and three GPU pods."""

from __future__ import annotations

from typing import Any

from apis import names
from apis.allocation import Allocation, GPUShare, encode_allocation
from tests.kubeapi.server import KubeAPIServer
from tests.kubectl_plugin.agents import GiB, Proc

PODS = "/api/v1/namespaces/{}/pods"
#: (namespace, name, uid, node, GPU, allocated core %, allocated GiB)
GPU_PODS = [
    ("ml", "train-0", "uid-train-0", "n1", "GPU-n1-00", 50, 40),
    ("ml", "serve-0", "uid-serve-0", "n1", "GPU-n1-00", 25, 20),
    ("web", "embed-0", "uid-embed-0", "n2", "GPU-n2-01", 100, 80),
]
#: what the agents measure: train-0 runs two processes, serve-0 has started none yet; a pod the API
#: no longer has still shows, by uid
PROCESSES = {
    "n1": (["GPU-n1-00", "GPU-n1-01"], [Proc("uid-train-0", "GPU-n1-00", 30 * GiB), Proc("uid-train-0", "GPU-n1-00", 2 * GiB)]),
    "n2": (["GPU-n2-00", "GPU-n2-01"], [Proc("uid-embed-0", "GPU-n2-01", 61 * GiB), Proc("uid-gone", "GPU-n2-00", 1 * GiB)]),
}


def gpu_pod(namespace: str, name: str, uid: str, node: str, gpu: str, core: int, gib: int) -> dict[str, Any]:
    share = GPUShare(minor=0, uuid=gpu, core_percent=core, memory_bytes=gib * GiB, memory_ratio_percent=gib * 100 // 80)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "annotations": {names.DEVICE_ALLOCATED: encode_allocation(Allocation(gpus=(share,)))}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


def agent_pod(node: str, port: int, *, namespace: str = "fgpu-system") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"fgpu-agent-{node}", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "fgpu-agent", "app.kubernetes.io/component": "agent",
                                "app.kubernetes.io/part-of": "fgpu"}},
        "spec": {"nodeName": node, "hostNetwork": True, "containers": [
            {"name": "agent", "image": "fgpu", "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


def seed(api: KubeAPIServer, ports: dict[str, int]) -> None:
    for row in GPU_PODS:
        api.put_object(PODS.format(row[0]), gpu_pod(*row))
    for node, port in ports.items():
        api.put_object(PODS.format("fgpu-system"), agent_pod(node, port))
