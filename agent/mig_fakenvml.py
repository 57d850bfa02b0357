"""The MIG management calls of the fake NVML: GPU and compute instances with the real rules.

`agent.fakenvml.FakeNVML` inherits these. A GPU's profiles and legal placements
are NVIDIA's (apis/mig.py, from the MIG user guide); creating an instance checks
them as the driver does and fails with the driver's error:

- a profile id the GPU does not have, or a placement the profile never takes:
  `NVMLError_InvalidArgument`;
- memory slices already taken, compute slices or the profile's instance count
  exhausted: `NVMLError_InsufficientResources`;
- destroying a GPU instance that still has compute instances, or either one
  with processes on it, and switching MIG mode with instances or processes:
  `NVMLError_InUse`;
- a GPU without MIG, or not in MIG mode: `NVMLError_NotSupported`.

A mode change follows nvml.h: `nvmlDeviceSetMigMode` sets the *pending* mode and
tries to activate it with a GPU reset, returning the activation status:
NVML_SUCCESS when the GPU was idle (the current mode is then the new one),
NVML_ERROR_IN_USE when processes run on it or another client holds it open
(`hold_open`, as DCGM would), NVML_ERROR_RESET_REQUIRED on a platform that cannot
reset the GPU (`needs_reboot`, as a pass-through VM). A pending mode becomes current
at the next successful set or at `reboot`.

Simplifications (docs/mig.md): a compute instance always spans its whole GPU
instance (what fgpu creates); a mode change while GPU instances exist raises
`NVMLError_InUse` (not checked against a driver). Instances listed in the
inventory get the first placements that fit them together, since an inventory
names profiles, not placements.
"""

from __future__ import annotations

import ctypes
import threading
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from agent.fakenvml_inventory import GPUSpec, MIGSpec
from apis import mig
from apis.mig import MIGPlacement, MIGProfile, Occupied

#: NVML_COMPUTE_INSTANCE_PROFILE_* index -> compute slices.
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6, 7: 1}


def _error(cls_name: str) -> Exception:
    cls: type[Exception] = getattr(pynvml, f"NVMLError_{cls_name}")
    return cls()


@dataclass(frozen=True)
class FakeGpuInstance:
    """What nvmlDeviceCreateGpuInstance* and nvmlDeviceGetGpuInstanceById return."""

    gpu_index: int
    gi_id: int


@dataclass(frozen=True)
class FakeComputeInstance:
    gpu_index: int
    gi_id: int
    ci_id: int


@dataclass(frozen=True)
class FakeGpuInstanceInfo:
    """Same fields as pynvml's c_nvmlGpuInstanceInfo_t."""

    device: Any
    id: int
    profileId: int
    placement: Any


@dataclass
class _GI:
    profile: MIGProfile
    placement: MIGPlacement
    #: compute instance id -> MIG device UUID
    cis: dict[int, str] = field(default_factory=dict)


class FakeMIGCalls:
    """Mixin: the state lives in `_gis`, built from the inventory by `_init_mig`."""

    _cond: threading.Condition
    _gpus: list[GPUSpec]
    _gis: dict[int, dict[int, _GI]]
    _mig_serial: int
    #: GPU index -> the MIG mode that becomes current at the next reset (absent: the current one).
    _mig_pending: dict[int, bool]
    #: GPUs another client holds open (a reset fails), and GPUs that only a reboot resets.
    _held_open: set[int]
    _reboot_only: set[int]
    _gpu: Callable[[str, Any], GPUSpec]
    _checked: Callable[[str], None]
    #: The GPU handle of an index (fakenvml.FakeHandle, which this module cannot import without a circle).
    _handle_of: Callable[[int], Any]

    def _init_mig(self) -> None:
        self._gis = {}
        self._mig_serial = 0
        self._mig_pending = {}
        self._held_open = set()
        self._reboot_only = set()
        for g in self._gpus:
            table = mig.profiles_for_model(g.name, g.memory_bytes)
            if not table or not g.mig_instances:
                self._gis[g.index] = {}
                continue
            by_name = {p.name: p for p in table}
            wanted = tuple(by_name.get(m.profile) for m in g.mig_instances)
            layout = mig.lay_out(tuple(p for p in wanted if p is not None)) if None not in wanted else None
            if layout is None:
                continue  # an inventory layout the real rules reject: its GPU instances stay unmanaged
            gis: dict[int, _GI] = {}
            for spec, profile, placement in zip(g.mig_instances, wanted, layout, strict=True):
                assert profile is not None
                gi = gis.setdefault(spec.gpu_instance_id, _GI(profile=profile, placement=placement))
                gi.cis[spec.compute_instance_id] = spec.uuid
            self._gis[g.index] = gis

    # --- pynvml: MIG profiles and placements ------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        g = self._mig_gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        found = next((p for p in self._table(g) if p.nvml_index == profile), None)
        if found is None:
            raise _error("NotSupported" if 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT else "InvalidArgument")
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlGpuInstanceProfileInfo_t()
        info.id = found.profile_id
        info.isP2pSupported = 0
        info.sliceCount = found.slices
        info.instanceCount = found.instance_count
        info.multiprocessorCount = found.multiprocessors
        info.copyEngineCount = found.copy_engines
        info.decoderCount = found.decoders
        info.encoderCount = 0
        info.jpegCount = found.jpegs
        info.ofaCount = found.ofas
        info.memorySizeMB = found.memory_bytes // 2**20
        if version == 2:
            info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        g = self._mig_gpu("nvmlDeviceGetGpuInstancePossiblePlacements", handle)
        profile = self._profile(g, profileId)
        count = _target(countRef)
        if placementsRef is None:
            count.value = len(profile.placements)
            return 0
        if count.value < len(profile.placements):
            count.value = len(profile.placements)
            raise _error("InsufficientSize")
        for i, p in enumerate(profile.placements):
            placementsRef[i].start = p.start
            placementsRef[i].size = p.size
        count.value = len(profile.placements)
        return 0

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profileId: int) -> int:
        g = self._mig_gpu("nvmlDeviceGetGpuInstanceRemainingCapacity", handle)
        profile = self._profile(g, profileId)
        with self._cond:
            occupied = self._occupied(g.index)
            return len(mig.free_placements(profile, occupied)) if g.mig_enabled else 0

    # --- pynvml: GPU instances --------------------------------------------------------------

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> FakeGpuInstance:
        g = self._mig_gpu("nvmlDeviceCreateGpuInstanceWithPlacement", handle, enabled=True)
        profile = self._profile(g, profileId)
        where = MIGPlacement(int(placement.start), int(placement.size))
        with self._cond:
            return self._create_gi(g, profile, where)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profileId: int) -> FakeGpuInstance:
        g = self._mig_gpu("nvmlDeviceCreateGpuInstance", handle, enabled=True)
        profile = self._profile(g, profileId)
        with self._cond:
            free = mig.free_placements(profile, self._occupied(g.index))
            if not free:
                raise _error("InsufficientResources")
            return self._create_gi(g, profile, free[0])

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpuInstanceId: int) -> FakeGpuInstance:
        g = self._mig_gpu("nvmlDeviceGetGpuInstanceById", handle, enabled=True)
        with self._cond:
            if gpuInstanceId not in self._gis.get(g.index, {}):
                raise _error("NotFound")
        return FakeGpuInstance(gpu_index=g.index, gi_id=gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: FakeGpuInstance) -> FakeGpuInstanceInfo:
        gi = self._gi("nvmlGpuInstanceGetInfo", gpuInstance)
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = gi.placement.start, gi.placement.size
        return FakeGpuInstanceInfo(
            device=self._handle_of(gpuInstance.gpu_index), id=gpuInstance.gi_id, profileId=gi.profile.profile_id, placement=placement
        )

    def nvmlGpuInstanceDestroy(self, gpuInstance: FakeGpuInstance) -> int:
        gi = self._gi("nvmlGpuInstanceDestroy", gpuInstance)
        with self._cond:
            if gi.cis or self._busy(gpuInstance.gpu_index, gpuInstance.gi_id):
                raise _error("InUse")
            del self._gis[gpuInstance.gpu_index][gpuInstance.gi_id]
        return 0

    # --- pynvml: compute instances ----------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: FakeGpuInstance, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        gi = self._gi("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpuInstance)
        slices = _CI_SLICES.get(profile)
        if slices is None or engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _error("InvalidArgument")
        if slices > gi.profile.slices:
            raise _error("NotSupported")
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t() if version == 2 else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi.profile.slices // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.slices
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: FakeGpuInstance, profileId: int) -> FakeComputeInstance:
        gi = self._gi("nvmlGpuInstanceCreateComputeInstance", gpuInstance)
        slices = _CI_SLICES.get(profileId)
        if slices is None:
            raise _error("InvalidArgument")
        if slices != gi.profile.slices:
            raise _error("NotSupported")  # the fake models only compute instances spanning their GPU instance
        with self._cond:
            if gi.cis:
                raise _error("InsufficientResources")
            g = self._gpus[gpuInstance.gpu_index]
            self._mig_serial += 1
            mig_uuid = f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{g.uuid}/{gpuInstance.gi_id}/{self._mig_serial}')}"
            gi.cis[0] = mig_uuid
            spec = MIGSpec(
                uuid=mig_uuid, profile=gi.profile.name, memory_bytes=gi.profile.memory_bytes,
                slices=gi.profile.slices, gpu_instance_id=gpuInstance.gi_id, compute_instance_id=0,
            )
            self._gpus[g.index] = replace(g, mig_instances=(*g.mig_instances, spec))
        return FakeComputeInstance(gpu_index=gpuInstance.gpu_index, gi_id=gpuInstance.gi_id, ci_id=0)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: FakeGpuInstance, computeInstanceId: int) -> FakeComputeInstance:
        gi = self._gi("nvmlGpuInstanceGetComputeInstanceById", gpuInstance)
        if computeInstanceId not in gi.cis:
            raise _error("NotFound")
        return FakeComputeInstance(gpu_index=gpuInstance.gpu_index, gi_id=gpuInstance.gi_id, ci_id=computeInstanceId)

    def nvmlComputeInstanceDestroy(self, computeInstance: FakeComputeInstance) -> int:
        gi = self._gi("nvmlComputeInstanceDestroy", FakeGpuInstance(computeInstance.gpu_index, computeInstance.gi_id))
        with self._cond:
            if computeInstance.ci_id not in gi.cis:
                raise _error("NotFound")
            if self._busy(computeInstance.gpu_index, computeInstance.gi_id, computeInstance.ci_id):
                raise _error("InUse")
            mig_uuid = gi.cis.pop(computeInstance.ci_id)
            g = self._gpus[computeInstance.gpu_index]
            self._gpus[g.index] = replace(g, mig_instances=tuple(m for m in g.mig_instances if m.uuid != mig_uuid))
        return 0

    # --- pynvml: MIG mode --------------------------------------------------------------------

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Sets the pending mode and returns the activation status (pynvml returns it, nvml.h writes it out)."""
        g = self._mig_gpu("nvmlDeviceSetMigMode", handle)
        if mode not in (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE):
            raise _error("InvalidArgument")
        with self._cond:
            if self._gis.get(g.index) or g.mig_instances:
                raise _error("InUse")
            self._mig_pending[g.index] = mode == pynvml.NVML_DEVICE_MIG_ENABLE
            return self._activate(g.index)

    # --- controls for tests: what holds a GPU reset back -------------------------------------

    def hold_open(self, index: int, held: bool = True) -> None:
        """Another client (DCGM, a monitoring agent) keeps GPU `index` open: its reset fails (in use)."""
        with self._cond:
            (self._held_open.add if held else self._held_open.discard)(index)

    def needs_reboot(self, index: int, only: bool = True) -> None:
        """GPU `index` cannot be reset in place (GPU pass-through to a VM): a new mode waits for `reboot`."""
        with self._cond:
            (self._reboot_only.add if only else self._reboot_only.discard)(index)

    def reboot(self, index: int) -> None:
        """The node restarts: processes and MIG instances are gone, and the pending mode is current."""
        with self._cond:
            g = self._gpus[index]
            self._gis[index] = {}
            self._held_open.discard(index)
            pending = self._mig_pending.pop(index, g.mig_enabled)
            self._gpus[index] = replace(g, processes=(), mig_instances=(), mig_enabled=pending)

    def mig_pending(self, index: int) -> bool | None:
        with self._cond:
            return self._mig_pending.get(index, self._gpus[index].mig_enabled)

    def _activate(self, index: int) -> int:
        g = self._gpus[index]
        pending = self._mig_pending.get(index, g.mig_enabled)
        if pending == g.mig_enabled:
            return int(pynvml.NVML_SUCCESS)
        if index in self._reboot_only:
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)
        if g.processes or index in self._held_open:
            return int(pynvml.NVML_ERROR_IN_USE)
        self._gpus[index] = replace(g, mig_enabled=pending)
        del self._mig_pending[index]
        return int(pynvml.NVML_SUCCESS)

    # --- internals ---------------------------------------------------------------------------

    def _table(self, g: GPUSpec) -> tuple[MIGProfile, ...]:
        return mig.profiles_for_model(g.name, g.memory_bytes)

    def _mig_gpu(self, name: str, handle: Any, *, enabled: bool = False) -> GPUSpec:
        g = self._gpu(name, handle)
        if g.mig_enabled is None or not self._table(g) or getattr(handle, "mig_index", -1) >= 0:
            raise _error("NotSupported")
        if enabled and not g.mig_enabled:
            raise _error("NotSupported")
        if g.index not in self._gis:
            raise _error("NotSupported")  # an inventory layout the real rules reject (see _init_mig)
        return g

    def _profile(self, g: GPUSpec, profile_id: int) -> MIGProfile:
        found = next((p for p in self._table(g) if p.profile_id == profile_id), None)
        if found is None:
            raise _error("InvalidArgument")
        return found

    def _gi(self, name: str, gpu_instance: Any) -> _GI:
        if not isinstance(gpu_instance, FakeGpuInstance):
            self._checked(name)
            raise _error("InvalidArgument")
        g = self._gpu(name, self._handle_of(gpu_instance.gpu_index))
        with self._cond:
            gi = self._gis.get(g.index, {}).get(gpu_instance.gi_id)
        if gi is None:
            raise _error("NotFound")
        return gi

    def _occupied(self, gpu_index: int) -> tuple[Occupied, ...]:
        return tuple(Occupied(gi.profile.name, gi.profile.slices, gi.placement) for gi in self._gis[gpu_index].values())

    def _create_gi(self, g: GPUSpec, profile: MIGProfile, where: MIGPlacement) -> FakeGpuInstance:
        why = mig.misfit(profile, where, self._occupied(g.index), max_instances=g.mig_max_devices)
        if why is mig.Misfit.ILLEGAL:
            raise _error("InvalidArgument")
        if why is not None:
            raise _error("InsufficientResources")
        gis = self._gis[g.index]
        gi_id = 0 if profile.slices == mig.COMPUTE_SLICES else min(set(range(1, 15)) - set(gis))
        gis[gi_id] = _GI(profile=profile, placement=where)
        return FakeGpuInstance(gpu_index=g.index, gi_id=gi_id)

    def _busy(self, gpu_index: int, gi_id: int, ci_id: int | None = None) -> bool:
        return any(
            p.gpu_instance_id == gi_id and (ci_id is None or p.compute_instance_id == ci_id)
            for p in self._gpus[gpu_index].processes
        )


def _target(ref: Any) -> Any:
    """The c_uint behind ctypes.byref(...) or ctypes.pointer(...), or the c_uint itself."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref
