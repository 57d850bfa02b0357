"""Carries out `agent.mig_manager`'s decisions through NVML, and keeps fgpu's record of what it created.

`MIGNode.prepare(want)` runs before a pod's container starts: it creates the GPU
instance and its compute instance (or re-uses fgpu's free one at that placement)
and returns the MIG device UUID to make visible. `MIGNode.reconcile(gpus, live)` runs
when a sandbox is gone and after a restart: it destroys fgpu's instances that no
live pod holds and nothing runs on. A lock per GPU serialises both on that GPU, so a
destroy never races a create there, while another GPU's create goes on (NVML is
thread-safe; a create takes long). Live holds are read with the GPU's lock held
(after the caller's claim is in the admission ledger), so a pod claiming an instance
either is counted by a destroy or finds the instance gone and makes a new one. A
`MIGObserver` hears of every create, destroy and refusal (the agent counts them and
reports the node again, so the scheduler sees the instances as they are).

The record (`OwnedFile`) is a JSON list written atomically (a temporary file in the
same directory, fsync, rename; never through a symlink, never in a directory others
may write) around each create and after each destroy; it is only ever trusted where
NVML confirms it, MIG device UUID included (agent/mig_manager.py). A create writes an
intent before NVML is asked and the entry once the instance exists, so an agent that
dies in between leaves an intent that the next one resolves against NVML (`_settle`):
the instance at the intended place is fgpu's and goes when no pod holds it, rather
than being taken for an operator's and leaked.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pynvml

from agent import mig_discovery, mig_manager, nvmlapi
from agent.mig_manager import Create, Destroy, Instance, Intent, Owned, Refuse, Use, Want
from agent.mig_record import OwnedFile as OwnedFile
from agent.mig_record import Record as Record
from agent.mig_record import RecordError as RecordError
from agent.nvmlapi import NVML

log = logging.getLogger(__name__)

#: Compute instance ids probed inside a GPU instance.
_MAX_CI_ID = 8
#: MIG device UUIDs fgpu destroyed, remembered so that an admission naming one by a stale
#: picture is refused until discovery drops it (UUIDs never come back, so old ones are harmless).
_GONE_KEPT = 4096

#: The live holds, or how to read them (called with the GPU's lock held).
Live = Sequence[Want] | Callable[[], Sequence[Want]]


class MIGError(Exception):
    """A MIG instance could not be made ready; the message is the container's refusal reason."""


class MIGObserver(Protocol):
    def created(self, instance: Instance, *, pod_uid: str) -> None: ...

    def destroyed(self, instance: Instance) -> None: ...

    def failed(self, *, action: str, reason: str) -> None:
        """`action`: "create" (the container is refused with `reason`) or "destroy" (the instance stays)."""
        ...


class _Quiet:
    def created(self, instance: Instance, *, pod_uid: str) -> None:
        pass

    def destroyed(self, instance: Instance) -> None:
        pass

    def failed(self, *, action: str, reason: str) -> None:
        pass


class MIGNode:
    def __init__(self, nvml: NVML, record: OwnedFile, *, observer: MIGObserver | None = None) -> None:
        self._nvml = nvml
        self._record = record
        self._observer: MIGObserver = observer or _Quiet()
        #: One per GPU: NVML's MIG calls on that GPU and the record entries of it. Re-entrant: the
        #: mode switch holds it across its checks and `reconcile`.
        self._gpu_locks: dict[str, threading.RLock] = {}
        #: Guards `_gpu_locks` and `_gone`.
        self._locks_lock = threading.Lock()
        #: Read-modify-write of the record file (entries of different GPUs change concurrently).
        self._record_lock = threading.Lock()
        self._gone: dict[str, None] = {}

    @contextlib.contextmanager
    def locked(self, gpu_uuid: str) -> Iterator[None]:
        """The GPU's MIG lock. Lock order: a GPU's lock, then the admission ledger's, never the reverse."""
        with self._locks_lock:
            lock = self._gpu_locks.setdefault(gpu_uuid, threading.RLock())
        with lock:
            yield

    def destroyed_lately(self, mig_uuid: str) -> bool:
        """Whether fgpu destroyed (or is destroying) the MIG device `mig_uuid`."""
        return mig_uuid in self._gone

    def instances(self, gpu_uuids: list[str]) -> list[Instance]:
        return [i for uuid in gpu_uuids for i in read_instances(self._nvml, uuid)]

    def owned(self, gpu_uuids: list[str]) -> list[tuple[Instance, bool]]:
        """The GPUs' instances, each with whether it is fgpu's (intents settled first)."""
        out = []
        for gpu in gpu_uuids:
            with self.locked(gpu):
                instances = self.instances([gpu])
                owned = self._settle(gpu, instances)
            out += [(i, Owned.of(i) in owned) for i in instances]
        return out

    def prepare(self, want: Want, *, live: Live) -> str:
        """The MIG device UUID for `want`, created when needed; raises MIGError with the refusal reason.

        `live`: every live pod's wants; a callable is read with the GPU's lock held.
        """
        with self.locked(want.gpu_uuid):
            try:
                return self._prepare(want, _read(live))
            except MIGError as err:
                self._observer.failed(action="create", reason=str(err))
                raise
            except nvmlapi.NVMLError as err:  # reading the GPU's instances failed (GPU lost, driver gone)
                reason = f"reading the MIG instances of GPU {want.gpu_uuid}: {nvmlapi.error_text(err)}"
                self._observer.failed(action="create", reason=reason)
                raise MIGError(reason) from err

    def _prepare(self, want: Want, live: Sequence[Want]) -> str:
        instances = read_instances(self._nvml, want.gpu_uuid)
        owned = self._settle(want.gpu_uuid, instances)
        action = mig_manager.for_allocation(want, instances, owned, live)
        if isinstance(action, Refuse):
            raise MIGError(action.reason)
        if isinstance(action, Use):
            return action.instance.uuid
        assert isinstance(action, Create)
        intent = Intent(want.gpu_uuid, want.profile, want.placement_start)
        # Announced before NVML is asked: an agent that dies between the create and the entry
        # below leaves this intent, and the next one finds the instance it names (`_settle`).
        self._update(lambda r: Record(r.owned, r.intents | {intent}))
        try:
            made = self._create(want)
        except _HalfMade:
            raise  # the intent stays: the next reconcile finds the GPU instance left and destroys it
        except MIGError:
            # Nothing was made (NVML refused, or the half-made instance is gone again). Dropped, not
            # settled: an instance someone else put at the placement meanwhile is not fgpu's.
            self._update(lambda r: Record(r.owned, r.intents - {intent}))
            raise
        entry = Owned.of(made)

        def made_it(r: Record) -> Record:
            # This GPU's entries become what NVML confirms (entries of instances gone are dropped)
            # plus the new one; other GPUs' entries are theirs to settle.
            others = frozenset(o for o in r.owned if o.gpu_uuid != want.gpu_uuid)
            return Record(others | owned | {entry}, r.intents - {intent})

        # Written before the container starts: from here on the record proves the instance fgpu's.
        try:
            self._update(made_it)
        except MIGError:
            # Not recorded, the instance would be an operator's for good: it goes again (the
            # intent stays on disk if the first write got there, and settles the same way).
            with contextlib.suppress(MIGError):
                destroy(self._nvml, made)
            raise
        self._observer.created(made, pod_uid=want.pod_uid)
        return made.uuid

    def reconcile(
        self,
        gpu_uuids: list[str],
        live: Live,
        *,
        scope: list[Want] | None = None,
        choosing: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> list[Instance]:
        """Destroys fgpu's instances no live pod holds; returns what it destroyed.

        One GPU at a time, under its lock: intents an interrupted create left are settled first,
        the live holds read (`live`, when callable, with the GPU's lock held), and the record
        rewritten to what NVML confirms, so entries of instances gone are dropped. `scope`: only
        fgpu's instances these wants name (see `mig_manager.to_destroy`). `choosing`: a lock held
        while the live holds are read and the instances to destroy are marked gone (the admission
        ledger's: an admission naming one of them by UUID after that is refused, one before it is
        counted); the destroys themselves run without it.
        """
        destroyed = []
        for gpu in gpu_uuids:
            with self.locked(gpu):
                destroyed += self._reconcile(gpu, live, scope, choosing)
        return destroyed

    def _reconcile(
        self, gpu: str, live: Live, scope: list[Want] | None,
        choosing: Callable[[], contextlib.AbstractContextManager[object]] | None,
    ) -> list[Instance]:
        instances = self.instances([gpu])
        owned = self._settle(gpu, instances)
        with choosing() if choosing is not None else contextlib.nullcontext():
            actions = mig_manager.to_destroy(instances, owned, _read(live), scope=scope)
            self._forget_later([a.instance.uuid for a in actions if a.instance.uuid])
        destroyed = self._destroy(actions)
        gone = {Owned.of(i) for i in destroyed}
        kept = frozenset(o for o in owned if o not in gone)

        def confirmed(r: Record) -> Record:
            return Record(frozenset(o for o in r.owned if o.gpu_uuid != gpu) | kept, r.intents)

        before = self._record.load()
        if confirmed(before) != before:
            self._update(confirmed)
        return destroyed

    def _destroy(self, actions: list[Destroy]) -> list[Instance]:
        destroyed = []
        for action in actions:
            try:
                destroy(self._nvml, action.instance)
            except MIGError as err:
                with self._locks_lock:
                    self._gone.pop(action.instance.uuid, None)  # still there: usable again
                log.warning("MIG instance %s kept: %s", action.instance, err)
                self._observer.failed(action="destroy", reason=str(err))
                continue
            log.info("destroyed MIG %s (%s): %s", action.instance.uuid, action.instance.profile, action.reason)
            destroyed.append(action.instance)
            self._observer.destroyed(action.instance)
        return destroyed

    def _forget_later(self, uuids: list[str]) -> None:
        with self._locks_lock:
            for uuid in uuids:
                self._gone[uuid] = None
            while len(self._gone) > _GONE_KEPT:
                self._gone.pop(next(iter(self._gone)))

    def _update(self, change: Callable[[Record], Record]) -> Record:
        """The record read, changed and written as one step (another GPU's create may write it too)."""
        with self._record_lock:
            record = change(self._record.load())
            try:
                self._record.save(record)
            except RecordError as err:  # the refusal reason: the directory, its mode and the fix
                raise MIGError(str(err)) from err
            return record

    def _settle(self, gpu: str, instances: list[Instance]) -> frozenset[Owned]:
        """fgpu's instances among `instances` (what NVML shows on `gpu` now), with the intents on `gpu`
        resolved against them first and the record written back if there were any.

        Called with the GPU's lock held, so no create of this process is under way on it: an intent
        found is one an earlier agent left when it stopped mid-create.
        """
        record = self._record.load()
        if any(i.gpu_uuid == gpu for i in record.intents):
            def settled(r: Record) -> Record:
                stale = frozenset(i for i in r.intents if i.gpu_uuid == gpu)
                made = mig_manager.resolve_intents(instances, r.owned, stale)
                for o in made:
                    log.warning(
                        "MIG %s at memory slice %d of GPU %s (GPU instance %d) was created by an agent that stopped "
                        "before recording it: recorded as fgpu's now", o.profile, o.placement_start, o.gpu_uuid, o.gi_id,
                    )
                return Record(r.owned | made, r.intents - stale)

            try:
                record = self._update(settled)
            except MIGError as err:
                log.warning("MIG intents on GPU %s not settled: %s", gpu, err)
                return frozenset()
        return mig_manager.owned_now(instances, record.owned)

    def _create(self, want: Want) -> Instance:
        """The GPU instance and its compute instance; MIGError when NVML refuses, with nothing left behind
        (`_HalfMade` when a half-made GPU instance could not be destroyed again)."""
        handle = self._nvml.nvmlDeviceGetHandleByUUID(want.gpu_uuid)
        profile = next((p for p in mig_discovery.read_profiles(self._nvml, handle) if p.name == want.profile), None)
        if profile is None:
            raise MIGError(f"GPU {want.gpu_uuid} offers no MIG profile {want.profile!r}")
        where = next((p for p in profile.placements if p.start == want.placement_start), None)
        if where is None:
            raise MIGError(f"MIG profile {want.profile} cannot start at memory slice {want.placement_start} on GPU {want.gpu_uuid}")
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = where.start, where.size
        try:
            gi = self._nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.profile_id, placement)
        except nvmlapi.NVMLError as err:
            raise MIGError(_why(err, f"creating {want.profile} at memory slice {want.placement_start} of GPU {want.gpu_uuid}")) from err
        try:
            gi_id = int(self._nvml.nvmlGpuInstanceGetInfo(gi).id)
            try:
                self._nvml.nvmlGpuInstanceCreateComputeInstance(gi, nvmlapi.NVML_COMPUTE_INSTANCE_PROFILE_BY_SLICES[profile.slices])
            except (nvmlapi.NVMLError, KeyError) as err:
                raise MIGError(f"creating the compute instance of {want.profile} on GPU {want.gpu_uuid}: {err}") from err
            made = next((i for i in read_instances(self._nvml, want.gpu_uuid) if i.gi_id == gi_id), None)
            if made is None or not made.uuid:
                raise MIGError(f"MIG instance {want.profile} on GPU {want.gpu_uuid} was created but NVML shows no device for it")
        except (MIGError, nvmlapi.NVMLError) as err:
            reason = str(err) if isinstance(err, MIGError) else nvmlapi.error_text(err)
            try:
                _destroy_gpu_instance(self._nvml, gi)  # no half-made instance is left behind
            except nvmlapi.NVMLError as cleanup:
                raise _HalfMade(
                    f"{reason}; the half-made GPU instance could not be destroyed ({nvmlapi.error_text(cleanup)}), "
                    "the agent destroys it on a later pass"
                ) from err
            raise MIGError(reason) from err
        log.info("created MIG %s at %d on %s for pod %s: %s", want.profile, want.placement_start, want.gpu_uuid, want.pod_uid, made.uuid)
        return made


class _HalfMade(MIGError):
    """A create failed and left a GPU instance that could not be destroyed again."""


def _read(live: Live) -> Sequence[Want]:
    return live() if callable(live) else live


def read_instances(nvml: NVML, gpu_uuid: str) -> list[Instance]:
    """The GPU instances of one GPU with profile, placement, MIG device UUID and whether processes run on them."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    profiles = {p.profile_id: p.name for p in mig_discovery.read_profiles(nvml, handle)}
    devices: dict[int, str] = {}
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            dev = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvmlapi.NVMLError_NotFound:
            continue
        except nvmlapi.NVMLError_InvalidArgument:
            break
        devices[nvml.nvmlDeviceGetGpuInstanceId(dev)] = nvml.nvmlDeviceGetUUID(dev)
    busy = {int(getattr(p, "gpuInstanceId", 0xFFFFFFFF)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    out = []
    for gi_id, profile_id, placement in mig_discovery.gpu_instances(nvml, handle):
        out.append(Instance(
            gpu_uuid=gpu_uuid, gi_id=gi_id, profile=profiles.get(profile_id, str(profile_id)),
            placement_start=placement.start, uuid=devices.get(gi_id, ""), busy=gi_id in busy,
        ))
    return out


def destroy(nvml: NVML, instance: Instance) -> None:
    """Its compute instances, then the GPU instance; MIGError when NVML refuses (InUse: processes)."""
    handle = nvml.nvmlDeviceGetHandleByUUID(instance.gpu_uuid)
    try:
        _destroy_gpu_instance(nvml, nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gi_id))
    except nvmlapi.NVMLError as err:
        raise MIGError(_why(err, f"destroying GPU instance {instance.gi_id} of GPU {instance.gpu_uuid}")) from err


def _destroy_gpu_instance(nvml: NVML, gi: Any) -> None:
    for ci_id in range(_MAX_CI_ID):
        ci = _compute_instance(nvml, gi, ci_id)
        if ci is not None:
            nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)


def _compute_instance(nvml: NVML, gi: Any, ci_id: int) -> Any:
    try:
        return nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    except (nvmlapi.NVMLError_NotFound, nvmlapi.NVMLError_InvalidArgument):
        return None


def _why(err: BaseException, doing: str) -> str:
    if isinstance(err, nvmlapi.NVMLError_InsufficientResources):
        return f"{doing}: the placement is not free (NVML: insufficient resources); the scheduler will see it in the next report"
    if isinstance(err, nvmlapi.NVMLError_InUse):
        return f"{doing}: in use (NVML: in use by another client or process)"
    if isinstance(err, nvmlapi.NVMLError_NotSupported):
        return f"{doing}: not supported (is the GPU in MIG mode?)"
    return f"{doing}: {nvmlapi.error_text(err)}"
