"""A pod store in place of the API server, for tests of what the scheduler counts from pod annotations.

`bind` writes the pod as kube-apiserver's Binding would (node and annotations in
one write); a test then edits, forges or deletes pods as a pod author could,
and feeds each change to the service as the pod informer would (`deliver`,
`delete`). `restart` builds a new service from a listing, as a restarted
scheduler does: it remembers nothing the old process verified.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from apis import names
from apis.devices import NodeDevices
from scheduler_plugin.backend import JSON, Snapshot, StateSink
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import Conflict
from scheduler_plugin.events import EventRecorder
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.conftest import KEY


class PodStore:
    """Implements `scheduler_plugin.backend.Backend` over a dict of pods."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {}
        self.devices: dict[str, NodeDevices] = {}

    def start(self, sink: StateSink) -> None:
        sink.load(self.snapshot())

    def stop(self) -> None:
        return None

    def snapshot(self) -> Snapshot:
        return Snapshot(devices=tuple(self.devices.values()), pods=tuple(copy.deepcopy(p) for p in self.pods.values()))

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        uid = str(pod["metadata"]["uid"])
        held = self.pods.get(uid)
        if held is not None and held["spec"].get("nodeName") not in (None, node):
            raise Conflict(f"pod {uid} is bound to {held['spec']['nodeName']}")
        stored = copy.deepcopy(dict(pod))
        stored["metadata"]["annotations"] = {**(stored["metadata"].get("annotations") or {}), **annotations}
        stored["spec"]["nodeName"] = node
        self.pods[uid] = stored

    def release(self, uid: str) -> bool:
        return False

    def store_devices(self, devices: NodeDevices) -> None:
        self.devices[devices.node_name] = devices

    def get_pod(self, *, namespace: str, name: str) -> JSON | None:
        found = [p for p in self.pods.values() if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name]
        return copy.deepcopy(found[0]) if found else None

    def post_event(self, namespace: str, body: JSON) -> None:
        return None


class Cluster:
    """One PodStore and the service reading it, with the informer's part played by the test."""

    def __init__(self, *nodes: NodeDevices, recorder: Callable[[], EventRecorder | None] = lambda: None) -> None:
        self.store = PodStore()
        for devices in nodes:
            self.store.store_devices(devices)
        self._recorder = recorder
        self.service = self.restart()

    def restart(self) -> SchedulingService:
        """A new scheduler process over the same pods."""
        self.service = SchedulingService(core_factory=Scheduler, backend=self.store, signing_key=KEY, recorder=self._recorder())
        self.store.start(self.service)
        return self.service

    def bind(self, pod: JSON, node: str) -> JSON:
        """The scheduler binds `pod`; the informer then shows it bound. Returns the stored pod."""
        self.service.bind(pod, node)
        return self.deliver(self.store.pods[str(pod["metadata"]["uid"])])

    def deliver(self, pod: JSON) -> JSON:
        """Stores `pod` as it is now and tells the service (an informer ADDED/MODIFIED event)."""
        self.store.pods[str(pod["metadata"]["uid"])] = copy.deepcopy(pod)
        self.service.on_pod(copy.deepcopy(pod))
        return pod

    def edit(self, uid: str, **annotations: str | None) -> JSON:
        """A pod author rewrites annotations of their pod (None removes one); keys use `_` for `names`' attributes."""
        pod = copy.deepcopy(self.store.pods[uid])
        current = pod["metadata"].setdefault("annotations", {})
        for attribute, value in annotations.items():
            key = getattr(names, attribute)
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return self.deliver(pod)

    def delete(self, uid: str) -> None:
        pod = self.store.pods.pop(uid)
        self.service.on_pod_removed(pod)

    def gpu(self, node: str, uuid: str) -> tuple[int, int]:
        """(allocated core percent, allocated memory bytes) of one GPU in the scheduler's view."""
        for view in self.service.node_views([node]):
            for g in view.gpus:
                if g.device.uuid == uuid:
                    return g.allocated_core_percent, g.allocated_memory_bytes
        raise AssertionError(f"{node} has no GPU {uuid} in the scheduler's view")
