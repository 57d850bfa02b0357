"""The `kubernetes` state backend: Devices, Nodes and pods through the API.

On start it lists the three kinds once and hands the core one `Snapshot`
(every assigned, non-terminated pod with its allocation annotation), so no
decision is made before the state is whole. Then one informer per kind keeps
the core current: watch from the list's resourceVersion, and on a broken or
expired watch list again and reconcile (objects gone meanwhile are deleted
from the core), so a restarting API server costs a relist, never an
inconsistency.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from apis.device_object import from_unique_device_object
from apis.devices import DeviceError, NodeDevices
from apis.quantity import QuantityError, parse_quantity
from scheduler_plugin import binder, pods
from scheduler_plugin.backend import JSON, Snapshot, StateSink
from scheduler_plugin.core import noderules
from scheduler_plugin.core.api import NodeInfo, NodeName
from scheduler_plugin.errors import KubeAPIError, WatchExpired
from scheduler_plugin.kube import Kube, Listing, WatchStream

log = logging.getLogger(__name__)


@runtime_checkable
class NodeObjectsSink(Protocol):
    """A sink that can be told a node exists only while its Node object does (`SchedulingService`)."""

    def require_node_objects(self) -> None: ...


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    meta = node.get("metadata") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return NodeInfo(
        name=NodeName(str(meta.get("name") or "")),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        cpu_milli=_amount(allocatable.get("cpu"), scale=1000, field="allocatable.cpu"),
        memory_bytes=_amount(allocatable.get("memory"), scale=1, field="allocatable.memory"),
        rules=noderules.node_rules(node),
    )


def devices_of(obj: Mapping[str, Any]) -> NodeDevices | None:
    try:
        # A GPU listed twice would let its shares pile up on one entry while the other looked free.
        return from_unique_device_object(obj)
    except DeviceError as exc:
        log.error("Device %s unreadable, ignored until fixed: %s", (obj.get("metadata") or {}).get("name"), exc)
        return None


def _amount(raw: object, *, scale: int, field: str) -> int:
    if raw is None:
        return 0
    try:
        return int(parse_quantity(raw, field=field) * scale)
    except QuantityError as exc:
        log.warning("node %s unreadable (%s); treated as not tracked", field, exc)
        return 0


class Informer:
    """List+watch of one kind, feeding upserts and deletes, relisting when the watch breaks."""

    def __init__(
        self,
        *,
        kind: str,
        list_fn: Callable[[], Listing],
        watch_fn: Callable[..., WatchStream],
        on_upsert: Callable[[JSON], None],
        on_delete: Callable[[JSON], None],
        watch_timeout_s: int,
        backoff_s: float = 1.0,
    ) -> None:
        self.kind = kind
        self._list = list_fn
        self._watch_fn = watch_fn
        self._on_upsert = on_upsert
        self._on_delete = on_delete
        self._watch_timeout_s = watch_timeout_s
        self._backoff_s = backoff_s
        self._known: dict[str, JSON] = {}
        self._rv = ""
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None

    def initial(self) -> list[JSON]:
        """Lists once; the caller loads these items itself (one Snapshot), then calls `run`."""
        listing = self._list()
        self._rv = listing.resource_version
        self._known = {_key(o): o for o in listing.items}
        return listing.items

    def run(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"fgpu-informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        if self._thread is not None:
            self._thread.join(grace)

    def _loop(self) -> None:
        need_list = False
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                self._watch_once()
            except WatchExpired:
                log.info("%s watch expired; listing again", self.kind)
                need_list = True
            except KubeAPIError as exc:
                log.warning("%s watch failed (%s); listing again in %.1fs", self.kind, exc, self._backoff_s)
                need_list = True
                self._stop.wait(self._backoff_s)
            except Exception:  # a handler bug must not kill the informer forever
                log.exception("%s informer handler failed; listing again", self.kind)
                need_list = True
                self._stop.wait(self._backoff_s)

    def _watch_once(self) -> None:
        stream = self._watch_fn(resource_version=self._rv, timeout_s=self._watch_timeout_s)
        self._stream = stream
        if self._stop.is_set():
            return
        for event in stream:
            if self._stop.is_set():
                return
            obj = event.obj
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if event.type == "BOOKMARK":
                self._rv = rv or self._rv
                continue
            if event.type == "DELETED":
                self._known.pop(_key(obj), None)
                self._on_delete(obj)
            elif event.type in ("ADDED", "MODIFIED"):
                self._known[_key(obj)] = obj
                self._on_upsert(obj)
            if rv:
                self._rv = rv

    def _relist(self) -> None:
        listing = self._list()
        fresh = {_key(o): o for o in listing.items}
        for key, obj in list(self._known.items()):
            if key not in fresh:
                self._on_delete(obj)
        for obj in listing.items:
            self._on_upsert(obj)
        self._known = fresh
        self._rv = listing.resource_version


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class KubernetesBackend:
    def __init__(self, kube: Kube, *, watch_timeout_s: int = 60, max_backoff_s: float = 10.0) -> None:
        self._kube = kube
        self._watch_timeout_s = watch_timeout_s
        self._max_backoff_s = max_backoff_s
        self._informers: list[Informer] = []
        self._stop = threading.Event()

    def start(self, sink: StateSink) -> None:
        if isinstance(sink, NodeObjectsSink):
            # A Device is owned by its Node and deleted after it by the garbage collector: in
            # between (and after any relist then) it must not read as a node to schedule on.
            sink.require_node_objects()

        def on_device(obj: JSON) -> None:
            devices = devices_of(obj)
            if devices is not None:
                sink.on_devices(devices)

        def on_device_deleted(obj: JSON) -> None:
            sink.on_devices_removed(NodeName(str((obj.get("metadata") or {}).get("name") or "")))

        def on_node_deleted(obj: JSON) -> None:
            sink.on_node_removed(NodeName(str((obj.get("metadata") or {}).get("name") or "")))

        common = {"watch_timeout_s": self._watch_timeout_s}
        devices = Informer(
            kind="devices",
            list_fn=self._kube.list_devices,
            watch_fn=self._kube.watch_devices,
            on_upsert=on_device,
            on_delete=on_device_deleted,
            **common,
        )
        nodes = Informer(
            kind="nodes",
            list_fn=self._kube.list_nodes,
            watch_fn=self._kube.watch_nodes,
            on_upsert=lambda obj: sink.on_node(node_info(obj)),
            on_delete=on_node_deleted,
            **common,
        )
        pod_informer = Informer(
            kind="pods",
            list_fn=self._kube.list_pods,
            watch_fn=self._kube.watch_pods,
            on_upsert=sink.on_pod,
            on_delete=sink.on_pod_removed,
            **common,
        )
        backoff = 0.5
        while True:
            # An API server that is down at start delays the start; it never makes it decide on a partial state.
            try:
                device_items = devices.initial()
                node_items = nodes.initial()
                pod_items = pod_informer.initial()
                break
            except KubeAPIError as exc:
                log.warning("initial listing failed (%s); retrying in %.1fs", exc, backoff)
                if self._stop.wait(backoff):
                    raise
                backoff = min(backoff * 2, self._max_backoff_s)
        sink.load(_snapshot(device_items, node_items, pod_items))
        for pod in pod_items:
            if pods.wants_us(pod):
                sink.on_pod(pod)  # pending pods queue up for the standalone loop
        self._informers = [devices, nodes, pod_informer]
        for informer in self._informers:
            informer.run()

    def interrupt(self) -> None:
        """Makes a start() still waiting for the API give up; safe in a signal handler."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        for informer in self._informers:
            informer.stop()
        self._informers = []

    def snapshot(self) -> Snapshot:
        return _snapshot(self._kube.list_devices().items, self._kube.list_nodes().items, self._kube.list_pods().items)

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        binder.bind(self._kube, pod=pod, node=node, annotations=annotations)

    def release(self, uid: str) -> bool:
        return False  # the API server says when a pod is gone

    def store_devices(self, devices: NodeDevices) -> None:
        return None  # Device objects are the durable record; a report only feeds the core

    def get_pod(self, *, namespace: str, name: str) -> JSON | None:
        return self._kube.get_pod(namespace=namespace, name=name)

    def post_event(self, namespace: str, body: JSON) -> None:
        self._kube.create_event(namespace, body)


def _snapshot(device_items: list[JSON], node_items: list[JSON], pod_items: list[JSON]) -> Snapshot:
    devices = [d for d in (devices_of(o) for o in device_items) if d is not None]
    return Snapshot(
        devices=tuple(devices),
        nodes=tuple(node_info(n) for n in node_items),
        pods=tuple(p for p in pod_items if pods.holds_resources(p)),
    )
