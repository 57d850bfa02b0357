"""Carries out `agent.mig_manager`'s decisions through NVML, and keeps fgpu's record of what it created.

`MIGNode.prepare(want)` runs before a pod's container starts: it creates the GPU
instance and its compute instance (or re-uses fgpu's free one at that placement)
and returns the MIG device UUID to make visible. `MIGNode.reconcile(gpus, live)` runs
when a sandbox is gone and after a restart: it destroys fgpu's instances that no
live pod asks for and nothing runs on. One lock serialises both, so a destroy
never races a create on the node. A `MIGObserver` hears of every create,
destroy and refusal (the agent counts them and reports the node again, so the
scheduler sees the instances as they are).

The record (`OwnedFile`) is a JSON list written atomically (a temporary file, fsync,
rename) around each create and after each destroy; it is only ever trusted where
NVML confirms it (agent/mig_manager.py). A create writes an intent before NVML is
asked and the entry once the instance exists, so an agent that dies in between
leaves an intent that the next one resolves against NVML (`_settle`): the instance
at the intended place is fgpu's and goes when no pod holds it, rather than being
taken for an operator's and leaked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pynvml

from agent import mig_discovery, mig_manager, nvmlapi
from agent.mig_manager import Create, Instance, Intent, Owned, Refuse, Use, Want
from agent.nvmlapi import NVML

log = logging.getLogger(__name__)

#: GPU instance ids NVML hands out on A100/H100 (0 for a 7g, up to 14 for 1g instances).
_MAX_GI_ID = 15
#: Compute instance ids probed inside a GPU instance.
_MAX_CI_ID = 8


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


@dataclass(frozen=True)
class Record:
    """What the record file holds: fgpu's instances, and the creates announced but not yet confirmed."""

    owned: frozenset[Owned] = frozenset()
    intents: frozenset[Intent] = field(default_factory=frozenset)


class OwnedFile:
    """fgpu's record of the instances it created, on the node's disk.

    A JSON list: `{"gpu_uuid", "gi_id", "profile", "placement_start"}` per instance, and
    `{"intent": true, "gpu_uuid", "profile", "placement_start"}` per create under way. An
    older agent skips the intent rows (no `gi_id`), so a downgrade leaks rather than destroys.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    def read(self) -> frozenset[Owned]:
        return self.load().owned

    def load(self) -> Record:
        try:
            raw = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Record()
        except (OSError, ValueError) as err:
            # Unreadable: fgpu then owns nothing it finds, and leaks rather than destroys.
            log.warning("MIG record %s unreadable (%s); no instance found is taken for fgpu's", self._path, err)
            return Record()
        owned, intents = set(), set()
        for item in raw if isinstance(raw, list) else []:
            try:
                if isinstance(item, dict) and item.get("intent") is True:
                    intents.add(Intent(str(item["gpu_uuid"]), str(item["profile"]), int(item["placement_start"])))
                else:
                    owned.add(Owned(str(item["gpu_uuid"]), int(item["gi_id"]), str(item["profile"]), int(item["placement_start"])))
            except (KeyError, TypeError, ValueError):
                log.warning("MIG record %s: skipping entry %r", self._path, item)
        return Record(frozenset(owned), frozenset(intents))

    def save(self, record: Record) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        rows: list[dict[str, Any]] = sorted((asdict(o) for o in record.owned), key=lambda r: (r["gpu_uuid"], r["gi_id"]))
        rows += sorted(
            ({"intent": True, **asdict(i)} for i in record.intents), key=lambda r: (r["gpu_uuid"], r["placement_start"])
        )
        # fsync before the rename: the intent must be on disk before NVML is asked to create.
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(json.dumps(rows, sort_keys=True))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self._path)


class MIGNode:
    def __init__(self, nvml: NVML, record: OwnedFile, *, observer: MIGObserver | None = None) -> None:
        self._nvml = nvml
        self._record = record
        self._observer: MIGObserver = observer or _Quiet()
        self._lock = threading.Lock()

    def instances(self, gpu_uuids: list[str]) -> list[Instance]:
        return [i for uuid in gpu_uuids for i in read_instances(self._nvml, uuid)]

    def owned(self, gpu_uuids: list[str]) -> list[tuple[Instance, bool]]:
        """The GPUs' instances, each with whether it is fgpu's (intents settled first)."""
        with self._lock:
            instances = self.instances(gpu_uuids)
            _, owned = self._settle(gpu_uuids, instances)
        return [(i, Owned(i.gpu_uuid, i.gi_id, i.profile, i.placement_start) in owned) for i in instances]

    def prepare(self, want: Want, *, live: list[Want]) -> str:
        """The MIG device UUID for `want`, created when needed; raises MIGError with the refusal reason."""
        with self._lock:
            try:
                return self._prepare(want, live)
            except MIGError as err:
                self._observer.failed(action="create", reason=str(err))
                raise
            except nvmlapi.NVMLError as err:  # reading the GPU's instances failed (GPU lost, driver gone)
                reason = f"reading the MIG instances of GPU {want.gpu_uuid}: {nvmlapi.error_text(err)}"
                self._observer.failed(action="create", reason=reason)
                raise MIGError(reason) from err

    def _prepare(self, want: Want, live: list[Want]) -> str:
        instances = read_instances(self._nvml, want.gpu_uuid)
        record, owned = self._settle([want.gpu_uuid], instances)
        holders = {(w.gpu_uuid, w.placement_start): w.pod_uid for w in live if w.pod_uid != want.pod_uid}
        action = mig_manager.for_allocation(want, instances, owned, holders)
        if isinstance(action, Refuse):
            raise MIGError(action.reason)
        if isinstance(action, Use):
            return action.instance.uuid
        assert isinstance(action, Create)
        # Announced before NVML is asked: an agent that dies between the create and the entry
        # below leaves this intent, and the next one finds the instance it names (`_settle`).
        self._record.save(Record(record.owned, record.intents | {Intent(want.gpu_uuid, want.profile, want.placement_start)}))
        try:
            made = self._create(want)
        except _HalfMade:
            raise  # the intent stays: the next reconcile finds the GPU instance left and destroys it
        except MIGError:
            # Nothing was made (NVML refused, or the half-made instance is gone again). Dropped, not
            # settled: an instance someone else put at the placement meanwhile is not fgpu's.
            self._record.save(record)
            raise
        # Written before the container starts: from here on the record proves the instance fgpu's.
        others = frozenset(o for o in record.owned if o.gpu_uuid != want.gpu_uuid)  # other GPUs' entries, untouched
        entry = Owned(want.gpu_uuid, made.gi_id, want.profile, want.placement_start)
        self._record.save(Record(others | owned | {entry}, record.intents))
        self._observer.created(made, pod_uid=want.pod_uid)
        return made.uuid

    def reconcile(self, gpu_uuids: list[str], live: list[Want], *, scope: list[Want] | None = None) -> list[Instance]:
        """Destroys fgpu's instances no live pod asks for; returns what it destroyed.

        `scope`: only fgpu's instances at these placements (see `mig_manager.to_destroy`).
        The record is rewritten to what NVML confirms, so entries of instances gone are dropped,
        and intents an interrupted create left on these GPUs are settled first.
        """
        with self._lock:
            instances = self.instances(gpu_uuids)
            record, owned = self._settle(gpu_uuids, instances)
            destroyed = []
            for action in mig_manager.to_destroy(instances, owned, live, scope=scope):
                try:
                    destroy(self._nvml, action.instance)
                except MIGError as err:
                    log.warning("MIG instance %s kept: %s", action.instance, err)
                    self._observer.failed(action="destroy", reason=str(err))
                    continue
                log.info("destroyed MIG %s (%s): %s", action.instance.uuid, action.instance.profile, action.reason)
                destroyed.append(action.instance)
                self._observer.destroyed(action.instance)
            gone = {(i.gpu_uuid, i.gi_id) for i in destroyed}
            # Entries of GPUs not looked at stay as they were: they are neither confirmed nor contradicted.
            looked = set(gpu_uuids)
            kept = frozenset(o for o in owned if (o.gpu_uuid, o.gi_id) not in gone)
            kept |= frozenset(o for o in record.owned if o.gpu_uuid not in looked)
            if kept != record.owned:
                self._record.save(Record(kept, record.intents))
            return destroyed

    def _settle(self, gpu_uuids: list[str], instances: list[Instance]) -> tuple[Record, frozenset[Owned]]:
        """The record with the intents on these GPUs resolved against `instances` (what NVML shows on
        them now) and written back if there were any; and fgpu's instances among `instances`.

        Called with `_lock` held, so no create of this process is under way: an intent found is one
        an earlier agent left when it stopped mid-create.
        """
        record = self._record.load()
        looked = set(gpu_uuids)
        stale = frozenset(i for i in record.intents if i.gpu_uuid in looked)
        if stale:
            made = mig_manager.resolve_intents(instances, record.owned, stale)
            for o in made:
                log.warning(
                    "MIG %s at memory slice %d of GPU %s (GPU instance %d) was created by an agent that stopped "
                    "before recording it: recorded as fgpu's now", o.profile, o.placement_start, o.gpu_uuid, o.gi_id,
                )
            record = Record(record.owned | made, record.intents - stale)
            self._record.save(record)
        return record, mig_manager.owned_now(instances, record.owned)

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
    for gi_id in range(_MAX_GI_ID):
        found = mig_discovery.instance_placement(nvml, handle, gi_id)
        if found is None:
            continue
        profile_id, placement = found
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
