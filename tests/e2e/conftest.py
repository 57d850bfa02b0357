"""The whole node, end to end: fgpu-scheduler -> fgpu-runtime-proxy -> fgpu-agent's hook -> real containerd.

Each test asks for a `Node`: one local stack (hack/localup/stack.py) per
isolation backend, started once per session and shared, since a start costs
seconds of two shared cores. A `Node` removes the pods its test created and
releases them at the scheduler when the test ends, so the GPUs are free for
the next test. Tests that stop or restart the agent use a stack of their own.

What a test reads is each container's OWN environment, as the container
printed it (`env`), never what a component says it did.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import yaml

from apis import names
from apis.keyfiles import load_key
from apis.quantity import parse_quantity
from apis.signing import SigningKey
from hack.localup import cri, podrun
from hack.localup.placing import Placement, SchedulerClient, Unschedulable
from hack.localup.report import ContainerState
from hack.localup.stack import NODE_NAME, Paths, Settings, Stack, StackError, teardown
from tests.localup.manifests import REPO

INVENTORY = REPO / "examples" / "inventories" / "h100-8x-nvlink.yaml"
BUSYBOX = "fgpu.local/busybox:1"
#: Bakes NVIDIA_VISIBLE_DEVICES=all into its config, as CUDA base images do.
CUDA_LIKE = "fgpu.local/cuda-like:1"
MIB = 2**20
BACKENDS = ("hami-core", "mps", "none")
ENV_COMMAND = ["sh", "-c", "env"]


def _unavailable() -> str | None:
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install containerd runc busybox-static)"
    if not any(os.path.isfile(p) for p in ("/bin/busybox", "/usr/bin/busybox")):
        return "busybox is not installed (apt-get install busybox-static)"
    if os.geteuid() != 0:
        return "the local stack needs root: containerd and runc create namespaces and mounts"
    return None


@dataclass(frozen=True)
class InventoryGPU:
    uuid: str
    minor: int
    memory_bytes: int


def inventory_gpus() -> tuple[InventoryGPU, ...]:
    """The fake node's GPUs as examples/inventories/h100-8x-nvlink.yaml lists them."""
    data = yaml.safe_load(INVENTORY.read_text())
    return tuple(
        InventoryGPU(uuid=g["uuid"], minor=int(g["minor"]), memory_bytes=int(parse_quantity(g["memory"])))
        for g in data["gpus"]
    )


def share_mib(percent: int, gpu_memory_bytes: int | None = None) -> int:
    """`percent` of one GPU's memory, in whole MiB: what CUDA_DEVICE_MEMORY_LIMIT_<i> says ("<MiB>m")."""
    memory = inventory_gpus()[0].memory_bytes if gpu_memory_bytes is None else gpu_memory_bytes
    return memory * percent // 100 // MIB


def container(
    name: str,
    *,
    core: int | None = None,
    ratio: int | None = None,
    command: list[str] | None = None,
    image: str = BUSYBOX,
    env: Mapping[str, str] | None = None,
    run_as_user: int | None = None,
) -> dict[str, Any]:
    """A container spec; `core`/`ratio` are koordinator.sh/gpu-core and gpu-memory-ratio limits."""
    spec: dict[str, Any] = {"name": name, "image": image, "command": command or ENV_COMMAND}
    limits = {}
    if core is not None:
        limits[names.GPU_CORE] = core
    if ratio is not None:
        limits[names.GPU_MEMORY_RATIO] = ratio
    if limits:
        spec["resources"] = {"limits": limits}
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if run_as_user is not None:
        spec["securityContext"] = {"runAsUser": run_as_user}
    return spec


def pod(
    name: str,
    containers: list[dict[str, Any]],
    *,
    init: list[dict[str, Any]] | None = None,
    scheduler: str = names.SCHEDULER_NAME,
) -> dict[str, Any]:
    """A pod spec in namespace e2e; `scheduler=""` leaves it to the default scheduler."""
    spec: dict[str, Any] = {"containers": containers}
    if scheduler:
        spec["schedulerName"] = scheduler
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "e2e"}, "spec": spec}


@dataclass
class Scheduled:
    """A pod as fgpu-scheduler left it: where, with what annotations (none for a pod it gave no GPU)."""

    pod: dict[str, Any]
    placement: Placement


class Node:
    """One test's hands on a stack: schedule pods, run them as kubelet would, clean up after."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        # Annotations come from the scheduler's record of the bound pod (no RPC answer carries them).
        self.scheduler = SchedulerClient(stack.scheduler_address, bound_pod=stack.bound_pod)
        self.kubelet = cri.Kubelet(stack.proxy_address)
        self._runs: list[podrun.PodRun] = []
        self._bound: list[dict[str, Any]] = []

    @property
    def isolation(self) -> str:
        return self.stack.settings.isolation

    def signing_key(self) -> SigningKey:
        return load_key(self.stack.paths.signing_key)

    def schedule(self, spec: Mapping[str, Any]) -> Scheduled:
        """Filter, Score, Reserve, Bind through fgpu-scheduler's gRPC API; fails the test if it stays Pending."""
        prepared = podrun.prepare(spec)
        placed = self.scheduler.place(prepared)
        if isinstance(placed, Unschedulable):
            pytest.fail(f"pod {prepared['metadata']['name']} stayed Pending: {placed.reason}")
        self._bound.append(prepared)
        return Scheduled(pod=prepared, placement=placed)

    def start(self, scheduled: Scheduled | Mapping[str, Any], *, annotations: Mapping[str, str] | None = None) -> podrun.PodRun:
        """RunPodSandbox for a scheduled pod (with the scheduler's annotations), or for a pod spec
        with the `annotations` given (a pod the default scheduler placed, or a forged one)."""
        if isinstance(scheduled, Scheduled):
            prepared = scheduled.pod
            written = dict(scheduled.placement.annotations)
        else:
            # A pod already given its UID (one whose allocation a test signs for that UID) keeps it.
            has_uid = bool((scheduled.get("metadata") or {}).get("uid"))
            prepared = dict(scheduled) if has_uid else podrun.prepare(scheduled)
            written = {}
        pod_annotations = {**(prepared["metadata"].get("annotations") or {}), **written, **(annotations or {})}
        pod_run = podrun.start(
            self.kubelet, prepared, annotations=pod_annotations, node=NODE_NAME, pods_dir=self.stack.paths.pods_dir
        )
        self._runs.append(pod_run)
        return pod_run

    def run(self, spec: Mapping[str, Any], *, leave_running: bool = False) -> podrun.PodRun:
        """Schedules the pod when it names fgpu-scheduler, then runs it to the end (or leaves it running)."""
        scheduled: Scheduled | Mapping[str, Any] = spec
        if (spec.get("spec") or {}).get("schedulerName") == names.SCHEDULER_NAME:
            scheduled = self.schedule(spec)
        return podrun.run(self.kubelet, self.start(scheduled), leave_running=leave_running)

    def resume(self, pod_run: podrun.PodRun, *, leave_running: bool = False) -> podrun.PodRun:
        """kubelet's retry: creates again what was refused."""
        return podrun.run(self.kubelet, pod_run, leave_running=leave_running)

    def remove(self, pod_run: podrun.PodRun) -> None:
        podrun.remove(self.kubelet, pod_run)
        if pod_run in self._runs:
            self._runs.remove(pod_run)

    def container_running(self, container_id: str) -> bool:
        return bool(self.kubelet.container_status(container_id).state == cri.CONTAINER_RUNNING)

    def close(self) -> None:
        """Removes every pod the test left and releases its allocation at the scheduler."""
        for pod_run in reversed(self._runs):
            podrun.remove(self.kubelet, pod_run)
        self._runs.clear()
        for bound in self._bound:
            with contextlib.suppress(grpc.RpcError):
                self.scheduler.release(bound, node=NODE_NAME)
        self._bound.clear()
        self.scheduler.close()
        self.kubelet.close()

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} (last lines of {d.log_path})\n{d.log_tail(40)}" for d in self.stack.daemons)


#: What a container without a GPU must not carry: fgpu's informative variables and any limit.
ISOLATION_PREFIXES = ("FGPU_", "CUDA_DEVICE_", "CUDA_MPS_")


def isolation_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The FGPU_*, CUDA_DEVICE_* and CUDA_MPS_* variables of an env."""
    return {k: v for k, v in env.items() if k.startswith(ISOLATION_PREFIXES)}


def describe(pod_run: podrun.PodRun) -> str:
    """Every container of a pod, for assertion messages."""
    lines = [f"pod {pod_run.namespace}/{pod_run.name} annotations={pod_run.annotations}"]
    for c in pod_run.containers:
        shown = {k: v for k, v in sorted(c.env.items()) if k.startswith(("NVIDIA_", "FGPU_", "CUDA_"))}
        lines.append(f"  {c.name}{' (init)' if c.init else ''}: {c.describe()} env={shown}")
        if c.state is ContainerState.EXITED and not c.succeeded:
            # What it wrote besides `env` output: the shell's error, usually.
            lines += [f"    | {line}" for line in c.output if "=" not in line][-10:]
    return "\n".join(lines)


class Stacks:
    """Local stacks by (isolation backend, purpose), each started on first use and stopped at the end."""

    def __init__(self) -> None:
        self._stacks: dict[tuple[str, str], Stack] = {}

    def get(self, isolation: str, *, purpose: str = "shared") -> Stack:
        key = (isolation, purpose)
        if key not in self._stacks:
            root = tempfile.mkdtemp(prefix="fgpu-e2e-", dir="/tmp")  # short: unix socket paths
            stack = Stack(Paths(root), Settings(repo=str(REPO), inventory=str(INVENTORY), isolation=isolation))
            self._stacks[key] = stack
            try:
                stack.start()
            except StackError as exc:
                pytest.fail(f"local stack ({isolation}) did not come up: {exc}")
        return self._stacks[key]

    def stop_all(self) -> None:
        for stack in self._stacks.values():
            stack.stop()
            teardown(stack.paths.root)
        self._stacks.clear()


@pytest.fixture(scope="session")
def stacks() -> Iterator[Stacks]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    all_stacks = Stacks()
    try:
        yield all_stacks
    finally:
        all_stacks.stop_all()


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


@pytest.fixture
def nodes(stacks: Stacks, request: pytest.FixtureRequest) -> Iterator[Callable[..., Node]]:
    """`nodes("mps")`: a Node on the shared stack of that backend, cleaned up after the test."""
    made: list[Node] = []

    def make(isolation: str = "hami-core", *, purpose: str = "shared") -> Node:
        node = Node(stacks.get(isolation, purpose=purpose))
        made.append(node)
        return node

    yield make
    failed = request.node.stash.get(_FAILED, False)
    for node in made:
        if failed:
            print(node.logs())  # shown under "Captured stdout teardown"
        node.close()


@pytest.fixture
def hami(nodes: Callable[..., Node]) -> Node:
    return nodes("hami-core")
