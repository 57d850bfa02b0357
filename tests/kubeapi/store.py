"""The double's etcd: objects, one cluster-wide resourceVersion counter, and the change history.

Every write bumps the counter, stamps the object with it and appends a
`Change` to a bounded history; watches read the history, and a watch (or a
paginated list) that needs changes older than what is retained gets 410
Gone, as from a compacted etcd. Stored objects are never mutated after they
are stored, so changes and readers can share them without copying.
All methods are thread-safe: one condition variable guards everything and
wakes watchers on each change.
"""

from __future__ import annotations

import collections
import copy
import datetime
import secrets
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubeapi import deletion, errors, patching, strategies
from tests.kubeapi.resources import BUILTIN, CRD, PODS, ResourceInfo, from_crd

Obj = dict[str, Any]
Matcher = Callable[[Mapping[str, Any]], bool]
_SNAPSHOTS = 64
#: Kinds whose DELETE answers with the deleted object rather than a Status (`ReturnDeletedObject`).
_RETURNS_DELETED = frozenset({"Pod"})


@dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    storage_key: str
    namespace: str
    obj: Mapping[str, Any]
    prev: Mapping[str, Any] | None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _present(resource: ResourceInfo, obj: Mapping[str, Any]) -> Obj:
    """A caller-owned copy, labelled with the version the caller asked through."""
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = resource.api_version
    return out


def _comparable(obj: Mapping[str, Any]) -> Obj:
    meta = {
        k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")
    }
    return {**obj, "metadata": meta}


class Store:
    def __init__(
        self, *, history: int, clock: Callable[[], str] = _now, graceful_pod_deletion: bool = False
    ) -> None:
        if history < 1:
            raise ValueError(f"history={history}: the double must retain at least one change; use e.g. 1000")
        self.cond = threading.Condition()
        self._history_limit = history
        self._clock = clock
        self._graceful_pods = graceful_pod_deletion
        self.rv = 0
        #: Changes with rv <= compacted_rv are gone; a watch from before it gets 410.
        self.compacted_rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self._history: collections.deque[Change] = collections.deque()
        self._snapshots: collections.OrderedDict[str, tuple[int, list[Obj]]] = collections.OrderedDict()
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._seed_builtin_namespace(name)

    def _seed_builtin_namespace(self, name: str) -> None:
        namespaces = next(r for r in BUILTIN if r.plural == "namespaces")
        self.seed(namespaces, "", {"metadata": {"name": name}})

    def now(self) -> str:
        """The store's clock (RFC 3339), for writes made on a request's behalf (an eviction's disruptedPods)."""
        return self._clock()

    # --- resources ------------------------------------------------------------

    def resources(self) -> list[ResourceInfo]:
        with self.cond:
            crds = list(self._objects[CRD.storage_key].values())
        custom = [info for crd in crds for info in from_crd(crd)]
        return [*BUILTIN, *custom]

    def resolve(self, group: str, version: str, plural: str) -> ResourceInfo | None:
        for resource in self.resources():
            if (resource.group, resource.version, resource.plural) == (group, version, plural):
                return resource
        return None

    # --- writes -------------------------------------------------------------------

    def _record(self, type_: str, resource: ResourceInfo, namespace: str, obj: Obj, prev: Obj | None) -> None:
        self._history.append(Change(self.rv, type_, resource.storage_key, namespace, obj, prev))
        while len(self._history) > self._history_limit:
            self.compacted_rv = self._history.popleft().rv
        self.cond.notify_all()

    def _stamp(self, obj: Obj) -> Obj:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return obj

    def _namespace(self, resource: ResourceInfo, namespace: str | None, obj: Obj) -> str:
        meta = obj.setdefault("metadata", {})
        if not resource.namespaced:
            meta.pop("namespace", None)
            return ""
        if namespace is None:
            raise errors.method_not_allowed(
                f"{resource.qualified} are namespaced: use .../namespaces/<ns>/{resource.plural}"
            )
        if meta.get("namespace") not in (None, "", namespace):
            raise errors.bad_request(
                f"the namespace of the provided object ({meta['namespace']}) does not match the namespace "
                f"sent on the request ({namespace})"
            )
        meta["namespace"] = namespace
        return namespace

    def create(self, resource: ResourceInfo, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, Mapping):
            raise errors.bad_request(f"the body of a create must be a JSON object, got {type(body).__name__}")
        obj = copy.deepcopy(dict(body))
        with self.cond:
            ns = self._namespace(resource, namespace, obj)
            strategies.prepare_create(resource, obj, now=self._clock(), uid=str(uuid.uuid4()))
            name = obj["metadata"]["name"]
            if (ns, name) in self._objects[resource.storage_key]:
                raise errors.already_exists(resource, name)
            self._stamp(obj)
            self._objects[resource.storage_key][ns, name] = obj
            self._record("ADDED", resource, ns, obj, None)
            return _present(resource, obj)

    def seed(self, resource: ResourceInfo, namespace: str, body: Mapping[str, Any]) -> Obj:
        """Store an object as given (create or replace), filling only identity fields: for test setup."""
        obj = copy.deepcopy(dict(body))
        with self.cond:
            ns = self._namespace(resource, namespace or None if resource.namespaced else None, obj)
            meta = obj["metadata"]
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = strategies.generate_name(meta["generateName"])
            if not meta.get("name"):
                raise errors.invalid(resource, "", [("metadata.name", "Required value")])
            obj["apiVersion"] = resource.api_version
            obj["kind"] = resource.kind
            old = self._objects[resource.storage_key].get((ns, meta["name"]))
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault(
                "creationTimestamp", old["metadata"]["creationTimestamp"] if old else self._clock()
            )
            self._stamp(obj)
            self._objects[resource.storage_key][ns, meta["name"]] = obj
            self._record("MODIFIED" if old else "ADDED", resource, ns, obj, old)
            return _present(resource, obj)

    def _current(self, resource: ResourceInfo, namespace: str | None, name: str) -> Obj:
        obj = self._objects[resource.storage_key].get((namespace or "", name))
        if obj is None:
            raise errors.not_found(resource, name)
        return obj

    def _commit(self, resource: ResourceInfo, old: Obj, new: Obj) -> Obj:
        """Store `new` in place of `old`: no-op when equal, removal when the last finalizer went."""
        ns = old["metadata"].get("namespace", "")
        name = old["metadata"]["name"]
        if _comparable(new) == _comparable(old):
            return old
        meta = new["metadata"]
        # As the real store's shouldDeleteDuringUpdate: a graceful deletion still
        # running (grace > 0) waits for the kubelet even when no finalizer is left.
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not meta.get("deletionGracePeriodSeconds"):
            self._stamp(new)
            del self._objects[resource.storage_key][ns, name]
            self._record("DELETED", resource, ns, new, old)
            return new
        return self._replace(resource, ns, name, new, old)

    def _replace(self, resource: ResourceInfo, ns: str, name: str, new: Obj, old: Obj) -> Obj:
        self._stamp(new)
        self._objects[resource.storage_key][ns, name] = new
        self._record("MODIFIED", resource, ns, new, old)
        return new

    def _check_preconditions(self, resource: ResourceInfo, old: Obj, rv: Any, uid: Any) -> None:
        name = old["metadata"]["name"]
        if uid and uid != old["metadata"]["uid"]:
            raise errors.conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old['metadata']['uid']}",
            )
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise errors.stale(resource, name)

    def update(
        self,
        resource: ResourceInfo,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
    ) -> Obj:
        if not isinstance(body, Mapping):
            raise errors.bad_request(
                f"the body of an update must be a JSON object, got {type(body).__name__}"
            )
        new = copy.deepcopy(dict(body))
        meta = new.setdefault("metadata", {})
        if meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        with self.cond:
            old = self._current(resource, namespace, name)
            self._namespace(resource, namespace, new)
            self._check_preconditions(resource, old, meta.get("resourceVersion"), meta.get("uid"))
            stored = strategies.prepare_update(resource, old, new, subresource=subresource)
            return _present(resource, self._commit(resource, old, stored))

    def patch(
        self,
        resource: ResourceInfo,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
    ) -> Obj:
        with self.cond:
            old = self._current(resource, namespace, name)
            new = patching.apply(content_type, old, patch, kind=resource.kind, custom=resource.custom)
            meta = new.setdefault("metadata", {})
            # A resourceVersion in the patch is a precondition, as for real.
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                self._check_preconditions(resource, old, meta.get("resourceVersion"), None)
            if meta.get("uid") != old["metadata"]["uid"]:
                self._check_preconditions(resource, old, None, meta.get("uid"))
            stored = strategies.prepare_update(resource, old, new, subresource=subresource)
            return _present(resource, self._commit(resource, old, stored))

    def delete(
        self, resource: ResourceInfo, namespace: str | None, name: str, options: Mapping[str, Any]
    ) -> Obj:
        requested = deletion.requested_grace(options)
        with self.cond:
            old = self._current(resource, namespace, name)
            preconditions = options.get("preconditions") or {}
            self._check_preconditions(
                resource, old, preconditions.get("resourceVersion"), preconditions.get("uid")
            )
            ns = old["metadata"].get("namespace", "")
            if self._graceful_pods and resource.kind == "Pod" and not resource.group:
                marked = copy.deepcopy(old)
                outcome = deletion.before_delete(marked, requested, now=self._clock())
                if outcome is deletion.Outcome.PENDING:
                    return _present(resource, old)
                if outcome is deletion.Outcome.GRACEFUL:
                    # Stored even when the grace is 0, as the real registry does:
                    # watchers see the deletionTimestamp (MODIFIED) before DELETED.
                    old = self._replace(resource, ns, name, marked, old)
                    if old["metadata"].get("finalizers") or old["metadata"]["deletionGracePeriodSeconds"]:
                        return _present(resource, old)
            if old["metadata"].get("finalizers"):
                if old["metadata"].get("deletionTimestamp"):
                    return _present(resource, old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = self._clock()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return _present(resource, self._commit(resource, old, new))
            gone = self._stamp(copy.deepcopy(old))
            del self._objects[resource.storage_key][ns, name]
            self._record("DELETED", resource, ns, gone, old)
            if resource.kind in _RETURNS_DELETED and not resource.custom:
                return _present(resource, gone)
            details: Obj = {"name": name, "kind": resource.plural, "uid": old["metadata"]["uid"]}
            if resource.group:
                details["group"] = resource.group
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }

    def delete_collection(
        self,
        resource: ResourceInfo,
        namespace: str | None,
        matcher: Matcher,
        options: Mapping[str, Any] | None = None,
    ) -> Obj:
        with self.cond:
            names = [
                (ns, name)
                for (ns, name), obj in sorted(self._objects[resource.storage_key].items())
                if (namespace is None or ns == namespace) and matcher(obj)
            ]
            deleted = [self.delete(resource, ns or None, name, options or {}) for ns, name in names]
        return self._list_body(resource, [d for d in deleted if d.get("kind") != "Status"], None)

    def bind(self, namespace: str, name: str, binding: Any) -> Obj:
        """POST pods/binding: assign a node once, as kube-apiserver's BindingREST does."""
        if not isinstance(binding, Mapping) or not isinstance(binding.get("target"), Mapping):
            raise errors.bad_request('a Binding needs a target: {"target": {"kind": "Node", "name": ...}}')
        node = binding["target"].get("name")
        if not node:
            raise errors.invalid(PODS, name, [("target.name", "Required value")])
        meta = binding.get("metadata") or {}
        with self.cond:
            old = self._current(PODS, namespace, name)
            # BindingREST.setPodHostAndAnnotations: the Binding's uid and resourceVersion are
            # preconditions on the pod (storage.Preconditions), each checked when given.
            self._check_preconditions(PODS, old, None, meta.get("uid"))
            rv = meta.get("resourceVersion")
            if rv and str(rv) != old["metadata"]["resourceVersion"]:
                raise errors.conflict(
                    PODS,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {rv}, "
                    f"ResourceVersion in object meta: {old['metadata']['resourceVersion']}",
                )
            if old["metadata"].get("deletionTimestamp"):
                raise errors.conflict(
                    PODS, name, f"pod {name} is being deleted, cannot be assigned to a host"
                )
            bound = (old.get("spec") or {}).get("nodeName")
            if bound:
                raise errors.conflict(PODS, name, f'pod {name} is already assigned to node "{bound}"')
            new = copy.deepcopy(old)
            new["spec"]["nodeName"] = node
            annotations = meta.get("annotations") or {}
            if annotations:
                new["metadata"].setdefault("annotations", {}).update(annotations)
            status = new.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": self._clock(),
                }
            )
            status["conditions"] = conditions
            self._commit(PODS, old, new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # --- reads ------------------------------------------------------------------------

    def get(self, resource: ResourceInfo, namespace: str | None, name: str) -> Obj:
        with self.cond:
            return _present(resource, self._current(resource, namespace, name))

    def _matching(self, resource: ResourceInfo, namespace: str | None, matcher: Matcher) -> list[Obj]:
        return [
            obj
            for (ns, _), obj in sorted(self._objects[resource.storage_key].items())
            if (namespace is None or ns == namespace) and matcher(obj)
        ]

    def _list_body(
        self, resource: ResourceInfo, items: list[Obj], token: str | None, remaining: int = 0
    ) -> Obj:
        if not resource.custom:
            # Items of built-in lists carry no kind/apiVersion on the wire.
            items = [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in items]
        meta: Obj = {"resourceVersion": str(self.rv)}
        if token:
            meta["continue"] = token
            meta["remainingItemCount"] = remaining
        return {
            "kind": resource.list_kind,
            "apiVersion": resource.api_version,
            "metadata": meta,
            "items": items,
        }

    def list_objects(
        self,
        resource: ResourceInfo,
        namespace: str | None,
        matcher: Matcher,
        *,
        limit: int = 0,
        continue_token: str = "",
    ) -> Obj:
        with self.cond:
            if continue_token:
                entry = self._snapshots.get(continue_token)
                if entry is None or entry[0] < self.compacted_rv:
                    raise errors.gone(
                        "The provided continue parameter is too old to display a consistent list result. "
                        "You can start a new list without the continue parameter."
                    )
                snapshot_rv, pending = entry
            else:
                snapshot_rv = self.rv
                pending = [_present(resource, o) for o in self._matching(resource, namespace, matcher)]
            page, rest = (pending[:limit], pending[limit:]) if limit > 0 else (pending, [])
            token = ""
            if rest:
                token = secrets.token_urlsafe(12)
                self._snapshots[token] = (snapshot_rv, rest)
                while len(self._snapshots) > _SNAPSHOTS:
                    self._snapshots.popitem(last=False)
            body = self._list_body(resource, page, token, len(rest))
            body["metadata"]["resourceVersion"] = str(snapshot_rv)
            return body

    def snapshot(
        self, resource: ResourceInfo, namespace: str | None, matcher: Matcher
    ) -> tuple[int, list[Obj]]:
        """Current matching objects and the rv they are current at (a watch's initial ADDED events)."""
        with self.cond:
            return self.rv, self._matching(resource, namespace, matcher)

    def changes_after(self, rv: int) -> list[Change] | None:
        """Changes newer than rv, oldest first; None when some of them were compacted away. Hold `cond`."""
        if rv < self.compacted_rv:
            return None
        newer = []
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            newer.append(change)
        newer.reverse()
        return newer

    def raw(self, resource: ResourceInfo, namespace: str, name: str) -> Obj | None:
        with self.cond:
            obj = self._objects[resource.storage_key].get((namespace, name))
            return _present(resource, obj) if obj is not None else None

    def wipe(self) -> None:
        """Lose every object but the CRDs (the cluster's schema), as after an etcd loss; watchers must relist."""
        with self.cond:
            crds = self._objects[CRD.storage_key]
            self._objects = collections.defaultdict(dict)
            self._objects[CRD.storage_key] = crds
            self._history.clear()
            self._snapshots.clear()
            self.compacted_rv = self.rv
            for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self._seed_builtin_namespace(name)
            self.cond.notify_all()
