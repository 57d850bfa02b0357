"""The real fgpu-agent as a benchmark's GPU hook: fake NVML, a key pair, and a pod allocation signed for it.

    agent = AgentHook(base_dir).start()      # fgpu-agent on the 8-GPU fake H100 inventory, serving hooks
    agent.write_registration(hook_dir)       # the shipped registration, pointed at this agent
    annotations = agent.pod_annotations(pod_uid="...")   # a signed allocation giving container "main" 50%
    ...
    agent.stop()

It runs as hack/localup/stack.py runs it (no Kubernetes, no scheduler, no
runtime to rebuild its ledger from), with its isolation paths under
`base_dir`. `Signer` is the one place that knows how allocations are signed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from apis.allocation import Allocation, ContainerShare, GPUShare  # noqa: E402

INVENTORY = os.path.join(ROOT, "examples", "inventories", "h100-8x-nvlink.yaml")
REGISTRATION = os.path.join(ROOT, "hack", "systemd", "10-fgpu-agent-hook.yaml")
NODE_NAME = "fgpu-bench"
#: the container the allocation gives GPU to; other names get `void`
CONTAINER = "main"


class Signer:
    """The one place that knows how allocations are signed: Ed25519 (apis.signing since #13), a fresh key
    pair whose public half is the agent's --verifying-keys directory."""

    def __init__(self, key_dir: str) -> None:
        from apis.keyfiles import public_pem
        from apis.signing import SigningKey

        self.key = SigningKey.generate()
        os.makedirs(key_dir, exist_ok=True)
        with open(os.path.join(key_dir, f"{self.key.key_id}.pub"), "wb") as f:
            f.write(public_pem(self.key.public))
        self.agent_flags = ["--verifying-keys", key_dir]

    def annotations(self, *, pod_uid: str, allocation: Allocation) -> dict[str, str]:
        from apis.signing import allocation_annotations

        return allocation_annotations(self.key, pod_uid=pod_uid, node_name=NODE_NAME, allocation=allocation)


def half_of_gpu0() -> Allocation:
    """50% of the inventory's first GPU (compute and memory), all of it for container `main`."""
    with open(INVENTORY) as f:
        gpu = yaml.safe_load(f)["gpus"][0]
    memory = _mebibytes(gpu["memory"]) * 2**20 // 2
    part = ContainerShare(CONTAINER, 50, memory, 50)
    return Allocation(gpus=(GPUShare(int(gpu["minor"]), gpu["uuid"], 50, memory, 50, containers=(part,)),))


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


class AgentHook:
    """fgpu-agent serving RuntimeHooks on `<base_dir>/agent.sock`."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self.socket_path = os.path.join(base_dir, "agent.sock")
        self.log_path = os.path.join(base_dir, "agent.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.signer = Signer(os.path.join(base_dir, "verifying-keys"))

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    def pod_annotations(self, *, pod_uid: str) -> dict[str, str]:
        """The pod's annotations carrying a signed allocation: half of GPU 0, all of it for `main`."""
        return self.signer.annotations(pod_uid=pod_uid, allocation=half_of_gpu0())

    def start(self) -> AgentHook:
        argv = [
            sys.executable, "-m", "agent.main", "--config", self._config(), "--no-kubernetes",
            "--node-name", NODE_NAME, "--fake-nvml", INVENTORY, "--hook-listen", self.endpoint,
            "--isolation", "hami-core", *self.signer.agent_flags, "--metrics-listen", "", "--log-level", "WARNING",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._serving():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log_path) as f:
                    raise RuntimeError(f"fgpu-agent did not start:\n{f.read()[-3000:]}")
            time.sleep(0.1)
        return self

    def write_registration(self, hook_dir: str) -> None:
        """The shipped registration (stages, failure policy, timeout), pointed at this agent."""
        with open(REGISTRATION) as f:
            registration = yaml.safe_load(f)
        for hook in registration["hooks"]:
            if hook["name"] == "fgpu-agent":
                hook["endpoint"] = self.endpoint
        os.makedirs(hook_dir, exist_ok=True)
        with open(os.path.join(hook_dir, "10-fgpu-agent.yaml"), "w") as f:
            yaml.safe_dump(registration, f, sort_keys=False)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def _serving(self) -> bool:
        if not os.path.exists(self.socket_path):
            return False
        with grpc.insecure_channel(self.endpoint) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def _config(self) -> str:
        """HAMi-core's paths inside `base_dir` (empty stand-in files), as the local stack writes them."""
        vgpu = os.path.join(self.base_dir, "vgpu")
        os.makedirs(vgpu, exist_ok=True)
        for name in ("libvgpu.so", "ld.so.preload"):
            open(os.path.join(vgpu, name), "a").close()
        config = {
            "isolationPaths": {
                "hamiLibrary": os.path.join(vgpu, "libvgpu.so"),
                "hamiPreload": os.path.join(vgpu, "ld.so.preload"),
                "hamiCacheRoot": os.path.join(self.base_dir, "hami-cache"),
                "hamiLockDir": os.path.join(self.base_dir, "vgpulock"),
                "mpsPipeDir": os.path.join(self.base_dir, "mps"),
            },
            "checkpointPath": os.path.join(self.base_dir, "kubelet_internal_checkpoint"),
        }
        path = os.path.join(self.base_dir, "agent.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        return path
