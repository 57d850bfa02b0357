"""The GPU hook's decision: may this container start, and with what GPU edits?

Pure: from the pod's annotations, this node's devices and the isolation
settings to a `HookDecision`. The runtime proxy calls PreCreateContainer for
every container; the gRPC servicer (`agent.hookserver`) turns the request into
a `HookRequest`, calls `decide`, and the decision back into a HookResponse.

A pod without an allocation, or with one that lists no GPU, gets no answer at
all (the proxy's own `void` rule hides the GPUs from it). A pod with one gets its GPUs only when the
allocation is signed for this pod on this node and fits the node as it is
now: every GPU present and healthy, MIG shares on MIG instances that exist
or that the node can create, and no GPU given more than it has, counting what the pods admitted before
hold (`held`, from `agent.admissions.AdmissionLedger`), and no memory-only share (0% compute, which
the backends read as no compute limit) on a card where other pods hold compute, nor compute beside
another pod's memory-only share (docs/isolation.md). A limited share is rejected while the
isolation backend cannot enforce it (`HookSettings.backend_problem`). Anything else is rejected with
a reason a person can act on, which the proxy turns into a failed CreateContainer.

A share that asks the node to create a MIG instance (`GPUShare.mig_profile`, docs/mig.md)
needs one step of I/O in the middle: the first answer, once everything else
fits, is `HookDecision.mig_needed`; the caller (`agent.hookserver`) has the
instances made (`agent.mig_lifecycle`) and asks again with their UUIDs
(`mig_ready`) or NVML's refusal (`mig_refused`). So nothing is created for an
allocation that does not verify or does not fit.

Each container gets only the GPUs the allocation names it for, each limited to
its own part (`apis.container_split`); a container named for none, such as a
logging sidecar, gets `void`. The ledger holds the pod's whole allocation either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.admissions import GPUHeld, Hold
from agent.hook_checks import (
    check_share,
    find_gpu,
    held_elsewhere,
    memory_only,
    mig_holders,
    mig_profile,
    mixed_card,
    pods_text,
)
from agent.isolation import burst, registry
from agent.isolation.container import edits_for, void_edits
from agent.isolation.edits import VisibleGPU
from agent.isolation.registry import IsolationPaths
from agent.mig_manager import Want
from agent.pci_address import bus_order_key
from apis import names
from apis.allocation import Allocation, AllocationError, decode_allocation, share_memory_bytes
from apis.container_edits import ContainerEdits
from apis.devices import NodeDevices
from apis.signing import SignatureError, VerifyingKeys, verified_annotation

_MAX_PERCENT = 100
_MIB = 1 << 20


@dataclass(frozen=True)
class HookRequest:
    pod_uid: str
    pod_namespace: str
    pod_name: str
    container_name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Names of the variables the container's request carries (pod spec env, earlier hooks' edits).
    env_names: tuple[str, ...] = ()
    #: The pod sandbox the container is created in, for the admission ledger ("" not known).
    sandbox_id: str = ""


@dataclass(frozen=True)
class HookDecision:
    """Edits to apply, a rejection, or neither (the pod has no allocation)."""

    edits: ContainerEdits | None = None
    rejection: str = ""
    #: Host directories the hook server makes before it answers with `edits`.
    host_dirs: tuple[str, ...] = ()
    #: The verified allocation, for logs and metrics.
    allocation: Allocation | None = None
    #: What the pod holds once admitted (GPU UUIDs resolved), for the admission ledger.
    holds: tuple[Hold, ...] = ()
    #: The allocation verifies and fits, but these MIG instances must exist first: create them
    #: and decide again with `mig_ready` (no edits and no rejection come with it).
    mig_needed: tuple[Want, ...] = ()


NO_ANSWER = HookDecision()


@dataclass(frozen=True)
class HookSettings:
    node_name: str
    #: The public keys (and, during the upgrade window, the v1 key) signatures are checked with.
    key: VerifyingKeys
    #: the isolation backend's registered name (`agent.isolation`)
    isolation: str = names.ISOLATION_HAMI_CORE
    paths: IsolationPaths = field(default_factory=IsolationPaths)
    #: Why the isolation backend cannot enforce a share on this node now (`agent.backendcheck`);
    #: empty when it can. Limited shares are then rejected; whole GPUs and MIG instances are not.
    backend_problem: str = ""


def decide(
    request: HookRequest,
    *,
    devices: NodeDevices,
    settings: HookSettings,
    held: Mapping[str, GPUHeld] | None = None,
    mig_ready: Mapping[Want, str] | None = None,
    mig_refused: Mapping[Want, str] | None = None,
) -> HookDecision:
    """`held`: per GPU UUID, what other pods admitted on this node hold (not this pod's own entry).

    `mig_ready`: MIG instances made for this pod's `mig_needed`, want -> MIG device UUID;
    `mig_refused`: want -> why it could not be made (the container is then rejected with it).
    """
    held = held or {}
    mig_ready = mig_ready or {}
    mig_refused = mig_refused or {}
    who = f"pod {request.pod_namespace}/{request.pod_name} ({request.pod_uid})"
    # Read once (as `lists_gpus` reads it), then its signature checked (as `verify_pod_annotations`
    # checks it, which would read it again): the JSON and its quantities cost as much as the signature.
    annotation = request.annotations.get(names.DEVICE_ALLOCATED)
    if not annotation:
        return NO_ANSWER
    unreadable: AllocationError | None = None
    try:
        allocation: Allocation | None = decode_allocation(annotation)
    except AllocationError as err:
        allocation, unreadable = None, err
    if allocation is not None and not allocation.gpus:
        # An allocation that lists no GPU grants nothing, so it needs no signature: the proxy's own
        # rule gives the container `void`. One that cannot be read is rejected, after its signature.
        return NO_ANSWER
    try:
        verified_annotation(
            settings.key, pod_uid=request.pod_uid, node_name=settings.node_name, annotations=request.annotations
        )
    except SignatureError as err:
        return HookDecision(rejection=f"{who}: GPU allocation rejected: {err}")
    if allocation is None:
        return HookDecision(rejection=f"{who}: GPU allocation rejected: {unreadable}")
    if not allocation.names_containers:
        return HookDecision(rejection=(
            f"{who}: the GPU allocation does not say which of the pod's containers get the GPUs "
            f"({names.ALLOCATION_CONTAINERS} in each entry's extension), so no container can be given a share; "
            "schedule the pod with fgpu-scheduler (delete it and let it be recreated)"
        ))
    if devices.discovery_error:
        return HookDecision(
            rejection=f"{who}: node {settings.node_name} cannot use its GPUs right now ({devices.discovery_error}); "
            "the pod must be scheduled elsewhere or wait for the driver"
        )
    problems: list[str] = []
    visible: list[tuple[str, VisibleGPU]] = []
    used: dict[str, tuple[int, int]] = {}
    #: GPUs where this pod holds a memory-only share
    alone: set[str] = set()
    seen_mig: set[str] = set()
    holds: list[Hold] = []
    needed: list[Want] = []
    for i, share in enumerate(allocation.gpus):
        gpu, problem = find_gpu(share, devices)
        if gpu is None:
            problems.append(f"gpu[{i}]: {problem}")
            continue
        problem = check_share(share, gpu, seen_mig=seen_mig) or held_elsewhere(gpu, devices, request.pod_uid)
        if problem:
            problems.append(f"gpu[{i}] {gpu.uuid}: {problem}")
            continue
        part = next((c for c in share.containers if c.name == request.container_name), None)
        if share.mig_profile:
            want = Want(request.pod_uid, gpu.uuid, share.mig_profile, share.mig_placement)
            made = mig_ready.get(want, "")
            # Another pod holds the placement (claimed while its instance is made, or made) or the
            # instance there by its UUID: never handed to two pods. Checked again with the UUID made.
            holders = mig_holders(gpu, held.get(gpu.uuid), placement=share.mig_placement, uuid=made)
            if holders:
                problems.append(
                    f"gpu[{i}] {gpu.uuid}: MIG instance {share.mig_profile} at memory slice {share.mig_placement} "
                    f"is already held by pod {', '.join(sorted(holders))}; the pod must be scheduled again"
                )
                continue
            if want in mig_refused:
                problems.append(f"gpu[{i}] {gpu.uuid}: {mig_refused[want]}")
                continue
            holds.append(Hold(
                gpu_uuid=gpu.uuid, mig_uuid=made, mig_profile=share.mig_profile, mig_placement=share.mig_placement,
                core_percent=share.core_percent,
            ))
            if not made:
                needed.append(want)
            elif part is not None:
                profile = mig_profile(gpu, share.mig_profile)
                visible.append((bus_order_key(gpu.topology.bus_id) + f"/p{share.mig_placement:02d}", VisibleGPU(
                    uuid=made, core_percent=part.core_percent,
                    memory_bytes=profile.memory_bytes if profile is not None else 0, unlimited=True,
                )))
            continue
        if share.mig_uuid:
            seen_mig.add(share.mig_uuid)
            holders = mig_holders(gpu, held.get(gpu.uuid), uuid=share.mig_uuid)
            if holders:
                problems.append(
                    f"gpu[{i}] {gpu.uuid}: MIG instance {share.mig_uuid} is already held by "
                    f"{pods_text(holders)}; the pod must be scheduled again"
                )
                continue
            holds.append(Hold(gpu_uuid=gpu.uuid, mig_uuid=share.mig_uuid, core_percent=share.core_percent))
            mig = next(m for m in gpu.mig_instances if m.uuid == share.mig_uuid)
            if part is not None:
                visible.append((bus_order_key(gpu.topology.bus_id) + f"/{mig.index:02d}", VisibleGPU(
                    uuid=mig.uuid, core_percent=part.core_percent, memory_bytes=mig.memory_bytes, unlimited=True
                )))
            continue
        share_bytes = share_memory_bytes(share, gpu_memory_bytes=gpu.memory_bytes)
        if not share.whole and share_bytes < _MIB:
            problems.append(
                f"gpu[{i}] {gpu.uuid}: memory share of {share_bytes} bytes is under 1 MiB, a limit no isolation "
                "backend can enforce (HAMi-core reads 0 as no limit); the allocation needs gpu-memory or "
                "gpu-memory-ratio"
            )
            continue
        core, memory = used.get(gpu.uuid, (0, 0))
        used[gpu.uuid] = (core + share.core_percent, memory + share_bytes)
        if memory_only(share):
            alone.add(gpu.uuid)
        holds.append(Hold(
            gpu_uuid=gpu.uuid, core_percent=share.core_percent, memory_bytes=share_bytes,
            memory_only=memory_only(share),
        ))
        if part is None:
            continue
        part_bytes = share_memory_bytes(part, gpu_memory_bytes=gpu.memory_bytes)
        if part.core_percent == 0 and share.core_percent > 0:
            # 0% reads as "no limit" to both backends: the container would take the pod's whole card.
            problems.append(
                f"gpu[{i}] {gpu.uuid}: container {part.name!r} is given memory only on a card where the pod has "
                f"{share.core_percent}% of compute; it would run with no compute limit"
            )
            continue
        if part.core_percent > share.core_percent or part_bytes > share_bytes:
            problems.append(
                f"gpu[{i}] {gpu.uuid}: container {part.name!r} is given {part.core_percent}% and {part_bytes} bytes, "
                f"more than the pod's {share.core_percent}% and {share_bytes} bytes"
            )
            continue
        if not part.whole and part_bytes < _MIB:
            problems.append(
                f"gpu[{i}] {gpu.uuid}: container {part.name!r} has a memory share of {part_bytes} bytes, under "
                "1 MiB, a limit no isolation backend can enforce"
            )
            continue
        visible.append((bus_order_key(gpu.topology.bus_id) or f"{gpu.minor:08d}", burst.with_limit(VisibleGPU(
            uuid=gpu.uuid, core_percent=part.core_percent, memory_bytes=part_bytes, unlimited=share.whole and part.whole
        ), share.limit, gpu_memory_bytes=gpu.memory_bytes)))
    for uuid, (core, memory) in used.items():
        gpu = next(g for g in devices.gpus if g.uuid == uuid)
        if core > _MAX_PERCENT or memory > gpu.memory_bytes:
            problems.append(
                f"{uuid}: allocation gives it {core}% of compute and {memory} bytes of memory in total, "
                f"more than the GPU has (100%, {gpu.memory_bytes} bytes)"
            )
            continue
        others = held.get(uuid, GPUHeld())
        if others.pods and (core + others.core_percent > _MAX_PERCENT or memory + others.memory_bytes > gpu.memory_bytes):
            problems.append(
                f"GPU {uuid}: this pod's {core}% of compute and {memory} bytes of memory on top of the "
                f"{others.core_percent}% and {others.memory_bytes} bytes held by {pods_text(others.pods)} "
                "is more than the GPU has "
                f"(100%, {gpu.memory_bytes} bytes); the scheduler's view of the node is out of date, "
                "the pod must be scheduled again"
            )
            continue
        mixed = mixed_card(uuid, core, memory_only=uuid in alone, others=others)
        if mixed:
            problems.append(mixed)
    if len({v.uuid for _, v in visible}) != len(visible):
        problems.append("the same GPU is listed twice; the scheduler must merge the shares")
    if problems:
        return HookDecision(rejection=f"{who}: GPU allocation does not fit node {settings.node_name}: " + "; ".join(problems))
    if needed:
        return HookDecision(allocation=allocation, holds=tuple(holds), mig_needed=tuple(needed))
    if not visible:
        # A sidecar, or an init container, that asked for no GPU itself.
        return HookDecision(edits=void_edits().edits, allocation=allocation, holds=tuple(holds))
    # CUDA ordinals follow PCI bus order (the hook sets CUDA_DEVICE_ORDER=PCI_BUS_ID), so the
    # per-GPU limits must be listed in that order too.
    ordered = [v for _, v in sorted(visible, key=lambda kv: kv[0])]
    if (
        settings.backend_problem
        and registry.backend(settings.isolation).enforces_limits
        and any(not v.unlimited for v in ordered)
    ):
        return HookDecision(rejection=(
            f"{who}: node {settings.node_name} cannot enforce a GPU share now: {settings.backend_problem}. "
            "Whole GPUs and MIG instances still work here; the pod needs a node whose FgpuIsolationReady "
            "condition is True"
        ))
    refused = burst.refusal(ordered, isolation=settings.isolation)
    if refused:
        return HookDecision(rejection=f"{who}: {refused}")
    given = edits_for(
        ordered,
        isolation=settings.isolation,
        paths=settings.paths,
        pod_uid=request.pod_uid,
        container_name=request.container_name,
        request_env=request.env_names,
    )
    return HookDecision(edits=given.edits, host_dirs=given.host_dirs, allocation=allocation, holds=tuple(holds))


def holds_of(allocation: Allocation, devices: NodeDevices) -> tuple[Hold, ...]:
    """What a pod with this (verified) allocation holds on the node, for the admission ledger.

    Lenient where `decide` is strict: a running pod is counted even when its GPU is unhealthy
    now, so that rebuilding the ledger can only make GPUs look fuller, never freer. A share
    whose GPU is not on the node holds nothing here.
    """
    holds: list[Hold] = []
    for share in allocation.gpus:
        gpu, _ = find_gpu(share, devices)
        if gpu is None:
            continue
        if share.mig_profile:
            made = next((
                m.uuid for m in gpu.mig_instances
                if m.profile == share.mig_profile and m.placement_start == share.mig_placement
            ), "")
            holds.append(Hold(
                gpu_uuid=gpu.uuid, mig_uuid=made, mig_profile=share.mig_profile, mig_placement=share.mig_placement,
                core_percent=share.core_percent,
            ))
        elif share.mig_uuid:
            holds.append(Hold(gpu_uuid=gpu.uuid, mig_uuid=share.mig_uuid, core_percent=share.core_percent))
        else:
            holds.append(Hold(
                gpu_uuid=gpu.uuid, core_percent=share.core_percent,
                memory_bytes=share_memory_bytes(share, gpu_memory_bytes=gpu.memory_bytes),
                memory_only=memory_only(share),
            ))
    return tuple(holds)
