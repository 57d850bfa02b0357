"""fgpu-agent metrics endpoints for `top`: the agent's own metrics object, fed a usage cycle, served over HTTP
by the prometheus_client server the agent daemon starts (agent/daemon.py), one per node."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from prometheus_client import start_http_server

from agent.metrics import AgentMetrics
from agent.usage import GPUUsage, ProcessUsage
from apis.devices import GPUInfo, NodeDevices

GiB = 1024**3


@dataclass(frozen=True)
class Proc:
    pod_uid: str
    gpu: str
    memory_bytes: int


@contextmanager
def agent_endpoint(node: str, gpus: Sequence[str], processes: Sequence[Proc], *, sm: int = 40) -> Iterator[int]:
    """An agent's /metrics on 127.0.0.1; yields its port."""
    metrics = AgentMetrics()
    metrics.observe_devices(
        NodeDevices(node_name=node, gpus=tuple(
            GPUInfo(index=i, minor=i, uuid=u, model="NVIDIA A100-SXM4-80GB", model_label="A100-SXM4-80GB", memory_bytes=80 * GiB, healthy=True)
            for i, u in enumerate(gpus)
        ))
    )
    metrics.observe_usage([
        GPUUsage(
            uuid=u, sm_utilization_percent=sm, memory_used_bytes=sum(p.memory_bytes for p in processes if p.gpu == u),
            processes=tuple(ProcessUsage(pid=100 + i, pod_uid=p.pod_uid, container_id="c", used_memory_bytes=p.memory_bytes)
                            for i, p in enumerate(processes) if p.gpu == u),
        )
        for u in gpus
    ])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def agents(*specs: tuple[str, Sequence[str], Sequence[Proc]]) -> Iterator[dict[str, int]]:
    """Several nodes' agents: node -> port."""
    with ExitStack() as stack:
        yield {node: stack.enter_context(agent_endpoint(node, gpus, procs)) for node, gpus, procs in specs}
