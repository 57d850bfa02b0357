"""Where the scheduler's state lives: the contract both state backends fulfil.

A backend is the durable side of the scheduler. It produces a `Snapshot`
(devices, nodes, bound pods in the API's JSON shape) from which the core is
rebuilt on start, feeds later changes to a `StateSink`, and makes a bind
durable. The `kubernetes` backend reads Devices, Nodes and pod annotations
through the API; the `embedded` backend keeps agent reports and allocations in
a SQLite file. Both produce the same shapes, so one rebuild path serves both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from apis.devices import NodeDevices
from scheduler_plugin.core.api import NodeInfo, NodeName

JSON = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """Everything needed to rebuild the core, read at one moment."""

    devices: tuple[NodeDevices, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    #: assigned, non-terminated pods (spec.nodeName set), with their annotations
    pods: tuple[JSON, ...] = ()


class StateSink(Protocol):
    """What a backend feeds (implemented by `scheduling.SchedulingService`)."""

    def load(self, snapshot: Snapshot) -> None:
        """Replaces the whole state (start, relist after a broken watch, leadership gained)."""
        ...

    def on_devices(self, devices: NodeDevices) -> None: ...

    def on_devices_removed(self, node: NodeName) -> None: ...

    def on_node(self, info: NodeInfo) -> None: ...

    def on_node_removed(self, node: NodeName) -> None: ...

    def on_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed (assigned, pending or finished)."""
        ...

    def on_pod_removed(self, pod: Mapping[str, Any]) -> None: ...


class Backend(Protocol):
    def start(self, sink: StateSink) -> None:
        """Loads the state into `sink` (returns once it is loaded), then keeps feeding changes."""
        ...

    def stop(self) -> None: ...

    def snapshot(self) -> Snapshot:
        """Reads the state now (used for a resync, e.g. on gaining leadership)."""
        ...

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        """Makes `pod` bound to `node` with `annotations`, durably.

        Raises errors.Conflict when the pod is bound elsewhere already,
        errors.NotFound when it is gone, errors.Unavailable when it could not
        tell whether the bind happened (the caller keeps the reservation until
        it expires or the pod shows up bound).
        """
        ...

    def release(self, uid: str) -> bool:
        """Forgets a bound pod where the backend is the source of truth (embedded); False otherwise."""
        ...

    def store_devices(self, devices: NodeDevices) -> None:
        """Keeps an agent's report (embedded: in the file; kubernetes: nothing, Devices are the truth)."""
        ...

    def get_pod(self, *, namespace: str, name: str) -> JSON | None: ...

    def post_event(self, namespace: str, body: JSON) -> None: ...
