"""Random schedule / forge / edit / restore / delete / resync / restart sequences with pods that carry
random, edited and unsigned annotations.

After every step, for every GPU in the scheduler's view:

* its counted use is at least what the allocations this process has seen
  verify put there (`known`): no allocation that fails verification makes a
  GPU look freer than the last verified state;
* it is not over-allocated (core or memory).

And an edit of a pod whose verified allocation this process knows lowers no
GPU's counted use at all.

A pod is restored (its signed annotations put back) only while this process
knows its verified allocation. Restoring one edited before a restart can
over-allocate a GPU truthfully: the new process knew no earlier verified state
and may have given that GPU away meanwhile (the limit docs/scheduler.md names;
the admission policy is what prevents the edit).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from apis import names
from apis.allocation import Allocation, share_memory_bytes
from scheduler_plugin.errors import ServiceError
from tests.scheduler_service.builders import GiB, gpu_node, pod, share_pod, whole_pod
from tests.scheduler_service.podstore import Cluster

NODES = ("n1", "n2")
GPUS = 2
KEYS = (names.DEVICE_ALLOCATED, names.ALLOCATION_SIGNATURE, names.ALLOCATION_NODE)

#: (allocated core %, allocated memory bytes, capacity core %, capacity memory bytes) per (node, GPU uuid)
Usage = dict[tuple[str, str], tuple[int, int, int, int]]

claims = st.lists(
    st.tuples(st.integers(0, GPUS), st.integers(0, 100), st.sampled_from([0, GiB, 39 * GiB, 10**30])), max_size=4
)


def _annotation(node: str, entries: list[tuple[int, int, int]], repeat: int) -> str:
    gpu = [
        {"minor": i, "id": f"GPU-{node}-{i:02d}", "resources": {names.GPU_CORE: str(core), names.GPU_MEMORY: str(memory)}}
        for i, core, memory in entries
    ]
    return json.dumps({"gpu": gpu * repeat})


class UnverifiedLifecycle(RuleBasedStateMachine):
    @initialize()
    def open(self) -> None:
        self.c = Cluster(*(gpu_node(n, gpus=GPUS, memory_gib=40) for n in NODES))
        # Names and uids repeat from run to run, so a failing sequence replays (and shrinks) the same.
        self._names = itertools.count()
        #: the annotations and allocation the scheduler wrote, by pod uid
        self.signed: dict[str, dict[str, str]] = {}
        self.allocations: dict[str, Allocation] = {}
        #: pods this process has seen with a verified allocation (its own bind, or a verified view)
        self.known: set[str] = set()

    # --- the scheduler places pods ---------------------------------------------------

    def _name(self, prefix: str) -> tuple[str, str]:
        """(name, uid) of a new pod."""
        name = f"{prefix}{next(self._names):04d}"
        return name, f"uid-{name}"

    def _schedule(self, p: dict[str, Any]) -> None:
        try:
            signed = self.c.service.schedule(p)
        except ServiceError:
            return
        if signed is None:
            return
        uid = str(p["metadata"]["uid"])
        self.c.deliver(self.c.store.pods[uid])
        if signed.annotations:
            self.signed[uid] = dict(signed.annotations)
            self.allocations[uid] = signed.allocation
            self.known.add(uid)

    @rule(core=st.sampled_from([10, 30, 60, 100]), memory_gib=st.integers(1, 40))
    def schedule_share(self, core: int, memory_gib: int) -> None:
        name, uid = self._name("s")
        self._schedule(share_pod(name, uid=uid, core=core, memory=f"{memory_gib}Gi"))

    @rule(gpus=st.integers(1, 2))
    def schedule_whole(self, gpus: int) -> None:
        name, uid = self._name("w")
        self._schedule(whole_pod(name, uid=uid, gpus=gpus))

    # --- pod authors ---------------------------------------------------------------

    @rule(
        node=st.sampled_from(NODES),
        request=st.sampled_from(["none", "share", "whole"]),
        entries=claims,
        repeat=st.sampled_from([1, 3, 500]),
        signature=st.sampled_from(["none", "bogus", "copied"]),
    )
    def forge(self, node: str, request: str, entries: list[tuple[int, int, int]], repeat: int, signature: str) -> None:
        annotations = {names.DEVICE_ALLOCATED: _annotation(node, entries, repeat)}
        if signature == "bogus":
            annotations[names.ALLOCATION_SIGNATURE] = "v1:" + "0" * 64
        elif signature == "copied" and self.signed:
            annotations[names.ALLOCATION_SIGNATURE] = next(iter(self.signed.values()))[names.ALLOCATION_SIGNATURE]
        name, uid = self._name("f")
        if request == "share":
            forged = share_pod(name, uid=uid, core=50, memory="20Gi", node_name=node, annotations=annotations)
        elif request == "whole":
            forged = whole_pod(name, uid=uid, node_name=node, annotations=annotations)
        else:
            forged = pod(name, uid=uid, requests={"cpu": "100m"}, node_name=node, annotations=annotations)
        self.c.deliver(forged)

    @rule(
        data=st.data(),
        kind=st.sampled_from(["lower", "move", "strip", "garbage", "flood", "remove", "copy"]),
        gpu=st.integers(0, GPUS - 1),
    )
    def edit(self, data: st.DataObject, kind: str, gpu: int) -> None:
        if not self.c.store.pods:
            return
        uid = data.draw(st.sampled_from(list(self.c.store.pods)))
        stored = self.c.store.pods[uid]
        node = stored["spec"]["nodeName"]
        current = dict(stored["metadata"].get("annotations") or {})
        text = current.get(names.DEVICE_ALLOCATED, "")
        changes: dict[str, str | None] = {}
        if kind == "lower":
            changes["DEVICE_ALLOCATED"] = _annotation(node, [(gpu, 1, 1024)], 1)
        elif kind == "move":
            changes["DEVICE_ALLOCATED"] = text.replace(f"GPU-{node}-00", "GPU-moved").replace(f"GPU-{node}-01", f"GPU-{node}-00")
        elif kind == "strip":
            changes["ALLOCATION_SIGNATURE"] = None
        elif kind == "garbage":
            changes["DEVICE_ALLOCATED"] = "{not json"
        elif kind == "flood":
            changes["DEVICE_ALLOCATED"] = _annotation(node, [(gpu, 100, 10**30)], 300)
        elif kind == "remove":
            changes = dict.fromkeys(("DEVICE_ALLOCATED", "ALLOCATION_SIGNATURE", "ALLOCATION_NODE"))
        else:
            other = data.draw(st.sampled_from(list(self.c.store.pods)))
            theirs = self.c.store.pods[other]["metadata"].get("annotations") or {}
            changes = {"DEVICE_ALLOCATED": theirs.get(names.DEVICE_ALLOCATED), "ALLOCATION_SIGNATURE": theirs.get(names.ALLOCATION_SIGNATURE)}
        before = self._usage()
        self.c.edit(uid, **changes)
        if uid in self.known and not self._verifies(uid):
            after = self._usage()
            lowered = [k for k in before if after[k][0] < before[k][0] or after[k][1] < before[k][1]]
            assert lowered == [], f"editing known pod {uid} ({kind}) lowered {lowered}"

    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        edited = [u for u in self.signed if u in self.known and not self._verifies(u)]
        if not edited:
            return
        uid = data.draw(st.sampled_from(edited))
        self.c.edit(uid, **{attr: self.signed[uid][key] for attr, key in zip(("DEVICE_ALLOCATED", "ALLOCATION_SIGNATURE", "ALLOCATION_NODE"), KEYS, strict=True)})

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if not self.c.store.pods:
            return
        uid = data.draw(st.sampled_from(list(self.c.store.pods)))
        self.c.delete(uid)
        self.known.discard(uid)

    # --- the scheduler process ----------------------------------------------------------

    @rule()
    def resync(self) -> None:
        self.c.service.resync(self.c.store)

    @rule()
    def restart(self) -> None:
        self.c.restart()
        self.known = {u for u in self.signed if u in self.c.store.pods and self._verifies(u)}

    # --- what must hold -----------------------------------------------------------------

    @invariant()
    def unverified_allocations_neither_free_nor_overfill_a_gpu(self) -> None:
        if not hasattr(self, "c"):
            return
        usage = self._usage()
        verified = self._known_usage()
        for key, (core, memory, core_cap, memory_cap) in usage.items():
            v_core, v_memory = verified.get(key, (0, 0))
            assert core >= v_core and memory >= v_memory, f"{key}: counted {core}%/{memory}B below verified {v_core}%/{v_memory}B"
            assert core <= core_cap and memory <= memory_cap, f"{key}: over-allocated, {core}%/{memory}B counted"

    def _verifies(self, uid: str) -> bool:
        have = self.c.store.pods[uid]["metadata"].get("annotations") or {}
        return all(have.get(k) == v for k, v in self.signed[uid].items())

    def _usage(self) -> Usage:
        return {
            (view.name, g.device.uuid): (g.allocated_core_percent, g.allocated_memory_bytes, 100, g.device.memory_bytes)
            for view in self.c.service.node_views()
            for g in view.gpus
        }

    def _known_usage(self) -> dict[tuple[str, str], tuple[int, int]]:
        gpus = {g.device.uuid: g.device for view in self.c.service.node_views() for g in view.gpus}
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for uid in self.known:
            node = self.c.store.pods[uid]["spec"]["nodeName"]
            for share in self.allocations[uid].gpus:
                gpu = gpus.get(share.uuid)
                if gpu is not None:
                    core, memory = out.get((node, share.uuid), (0, 0))
                    out[(node, share.uuid)] = (core + share.core_percent, memory + share_memory_bytes(share, gpu_memory_bytes=gpu.memory_bytes))
        return out


UnverifiedLifecycle.TestCase.settings = settings(
    max_examples=75, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_random_pods_with_forged_and_edited_allocations_never_overfill_or_free_a_gpu = UnverifiedLifecycle.TestCase
