"""The soak's cluster: one real containerd, the API double, and per simulated node an agent and a
proxy; two schedulers with Lease election.

Several nodes share one containerd. CRI puts every pod in the one "k8s.io"
containerd namespace, so nodes are kept apart by ownership, not by the
runtime: each node's kubelet driver (kubelet.py) creates only the pods the API
binds to its node, through its own proxy (its own hook registration, pointing
at its own agent), labels each sandbox `fgpu.soak/node=<node>`, and touches
only the sandboxes it created. Pod UIDs are unique cluster-wide, so no two
nodes ever name the same sandbox. Each agent has its own fake-NVML inventory
(the example inventories, with UUIDs made unique per node), its own HAMi cache
root and socket directory, and learns its pods from the API by node name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import yaml

from bench.soak import adapter
from bench.soak.kubeclient import NODES, Client
from hack.localup.stack import Daemon, grpc_serving, teardown
from tests.containerd.harness import Containerd
from tests.kubeapi.server import KubeAPIServer

DEFAULT_INVENTORIES = ("h100-8x-nvlink.yaml", "t4-4x-pcie.yaml", "h100-8x-nvlink.yaml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class GPU:
    uuid: str
    minor: int
    memory_bytes: int


@dataclass
class Node:
    name: str
    root: str
    inventory: str  # the healthy one
    gpus: tuple[GPU, ...]
    agent: Daemon
    proxy: Daemon
    agent_metrics: str
    agent_argv: list[str] = field(default_factory=list)
    lost_gpu: int = -1  # minor of a GPU the fault made fall off the bus, or -1

    @property
    def hook_sock(self) -> str:
        return os.path.join(self.root, "agent", "hooks.sock")

    @property
    def proxy_sock(self) -> str:
        return os.path.join(self.root, "cri.sock")

    @property
    def admin_sock(self) -> str:
        return os.path.join(self.root, "admin.sock")

    @property
    def pods_dir(self) -> str:
        return os.path.join(self.root, "pods")


def _node_inventory(repo: str, name: str, index: int, out: str) -> tuple[GPU, ...]:
    from apis.quantity import parse_quantity

    with open(os.path.join(repo, "examples", "inventories", name)) as f:
        data = yaml.safe_load(f)
    gpus = []
    for g in data["gpus"]:
        # Unique per node: the scheduler and the invariants key GPUs by (node, uuid) anyway,
        # but a UUID seen on two nodes would hide a container given another node's GPU.
        g["uuid"] = f"GPU-n{index:02d}" + str(g["uuid"])[len(f"GPU-n{index:02d}"):]
        gpus.append(GPU(uuid=g["uuid"], minor=int(g["minor"]), memory_bytes=int(parse_quantity(g["memory"]))))
    data.pop("events", None)
    with open(out, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return tuple(gpus)


def write_lost_inventory(node: Node, minor: int) -> str:
    """The node's inventory with an Xid 79 on GPU `minor` a second after NVML starts."""
    with open(node.inventory) as f:
        data = yaml.safe_load(f)
    index = next(i for i, g in enumerate(data["gpus"]) if int(g["minor"]) == minor)
    data["events"] = [{"gpu": index, "xid": 79, "after": 1}]
    path = os.path.join(node.root, "inventory-xid79.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path


class SoakStack:
    def __init__(
        self, *, root: str, repo: str, nodes: int, lease_s: float, isolation: str = "hami-core",
        inventories: tuple[str, ...] = DEFAULT_INVENTORIES, schedulers: int = 2, overcommit: str = "",
        agent_env: dict[str, str] | None = None,
    ) -> None:
        """`inventories`: names under examples/inventories/ (or paths), one per node in turn;
        `overcommit`: every agent's overcommit settings file ("" = none); `agent_env`: added to the agents'
        environment."""
        self.root = root
        self.repo = repo
        self.lease_s = lease_s
        self.isolation = isolation
        self.api = KubeAPIServer(graceful_pod_deletion=True, history=2000, bookmark_interval_s=1.0)
        self.containerd = Containerd(base_dir=os.path.join(root, "containerd"))
        self.nodes: list[Node] = []
        self.schedulers: list[Daemon] = []
        self.scheduler_metrics: list[str] = []
        self._n = nodes
        self._inventories = inventories
        self._schedulers = schedulers
        self._overcommit = overcommit
        self._agent_env = dict(agent_env or {})
        self.keys: adapter.Keys | None = None

    @property
    def daemons(self) -> list[Daemon]:
        return [*self.schedulers, *(d for n in self.nodes for d in (n.agent, n.proxy))]

    # --- start ----------------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(os.path.join(self.root, "logs"), exist_ok=True)
        self.api.start()
        self.api.install_crd(os.path.join(self.repo, adapter.DEVICE_CRD))
        self.keys = adapter.generate_keys(self.root)
        self.containerd.start()
        self.containerd.import_images()
        client = Client(self.api.url)
        for i in range(self._n):
            self._add_node(i, client)
        for i in range(self._schedulers):
            self._add_scheduler(i)
        for node in self.nodes:
            hook, admin = f"unix://{node.hook_sock}", f"unix://{node.admin_sock}"
            node.agent.wait_until(lambda a=hook: grpc_serving(a), what="hook SERVING")  # type: ignore[misc]
            node.proxy.wait_until(lambda a=admin: grpc_serving(a), what="admin SERVING")  # type: ignore[misc]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            devices = client.list("/apis/scheduling.koordinator.sh/v1alpha1/devices")
            if len(devices) >= len(self.nodes) and self.leader_pid():
                return
            time.sleep(0.2)
        raise RuntimeError("soak stack: no Device for every node or no scheduler leader after 60s")

    def _log(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{name}.log")

    def _add_node(self, i: int, client: Client) -> None:
        name = f"soak-n{i}"
        root = os.path.join(self.root, f"n{i}")
        for d in ("agent", "pods", "hooks.d"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        inventory = os.path.join(root, "inventory.yaml")
        gpus = _node_inventory(self.repo, self._inventories[i % len(self._inventories)], i, inventory)
        # What kubelet does first: register the node.
        client.create(NODES, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "256", "memory": "2Ti", "pods": "500"},
                       "capacity": {"cpu": "256", "memory": "2Ti", "pods": "500"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })
        assert self.keys is not None
        metrics = f"127.0.0.1:{free_port()}"
        node = Node(name=name, root=root, inventory=inventory, gpus=gpus,
                    agent=Daemon("", [], log_path="", cwd=root), proxy=Daemon("", [], log_path="", cwd=root),
                    agent_metrics=metrics)
        node.agent_argv = adapter.agent_argv(
            node=name, root=root, kubeconfig=self.api.kubeconfig_path, inventory=inventory,
            hook_sock=node.hook_sock, verifying_dir=self.keys.verifying_dir, metrics=metrics,
            isolation=self.isolation, overcommit=self._overcommit,
        )
        node.agent = Daemon(f"agent-{name}", node.agent_argv, log_path=self._log(f"agent-{name}"), cwd=root,
                            env=self._agent_env)
        node.agent.start()
        hooks = os.path.join(root, "hooks.d")
        adapter.write_hook_registration(repo=self.repo, hooks_dir=hooks, agent_sock=node.hook_sock)
        node.proxy = Daemon(
            f"proxy-{name}",
            adapter.proxy_argv(listen=node.proxy_sock, backend=self.containerd.address, hooks_dir=hooks,
                               admin=node.admin_sock),
            log_path=self._log(f"proxy-{name}"), cwd=root,
        )
        node.proxy.start()
        self.nodes.append(node)

    def _add_scheduler(self, i: int) -> None:
        assert self.keys is not None
        metrics = f"127.0.0.1:{free_port()}"
        argv = adapter.scheduler_config(
            path=os.path.join(self.root, f"scheduler-{i}.yaml"), kubeconfig=self.api.kubeconfig_path,
            grpc_sock=os.path.join(self.root, f"s{i}.sock"), metrics=metrics,
            signing_key=self.keys.signing_key, lease_s=self.lease_s,
        )
        daemon = Daemon(f"scheduler-{i}", argv, log_path=self._log(f"scheduler-{i}"), cwd=self.root)
        daemon.start()
        self.schedulers.append(daemon)
        self.scheduler_metrics.append(metrics)

    # --- looking ----------------------------------------------------------------------------
    def lease(self) -> dict[str, Any] | None:
        return self.api.get_object(
            f"/apis/coordination.k8s.io/v1/namespaces/{adapter.LEASE_NAMESPACE}/leases/{adapter.LEASE_NAME}"
        )

    def leader_pid(self) -> int:
        pid = adapter.leader_pid(self.lease())
        return pid if any(d.pid == pid and d.alive() for d in self.schedulers) else 0

    def leader(self) -> Daemon | None:
        pid = self.leader_pid()
        return next((d for d in self.schedulers if d.pid == pid), None)

    # --- faults' hands --------------------------------------------------------------------
    @staticmethod
    def kill9(daemon: Daemon) -> None:
        proc = daemon.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()

    @staticmethod
    def restart(daemon: Daemon) -> None:
        if not daemon.alive():
            daemon.start()

    def restart_agent_with(self, node: Node, inventory: str) -> None:
        """SIGTERM the agent and start it with another inventory (the fake has no runtime control)."""
        node.agent.stop()
        argv = list(node.agent_argv)
        argv[argv.index("--fake-nvml") + 1] = inventory
        node.agent.argv = argv

        node.agent.start()

    def metrics_text(self, address: str) -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as r:
            return str(r.read().decode())

    # --- stop -------------------------------------------------------------------------------
    def stop(self, *, keep: bool = False) -> None:
        for d in self.daemons:
            with contextlib.suppress(ProcessLookupError):
                if d.proc is not None:
                    os.kill(d.proc.pid, signal.SIGCONT)
            d.stop(grace_s=3)
        self.api.stop()
        self.containerd.cleanup()
        teardown(self.root, remove=not keep)
