"""Watch streams: the events one `?watch=true` request receives, from the store's change history.

Semantics follow the watch cache of kube-apiserver: `resourceVersion` unset or
"0" starts with a synthetic ADDED per existing object; N streams every change
after N; N older than the retained history gives one ERROR event carrying a
410 `Expired` Status. With selectors, an object that starts matching arrives
as ADDED and one that stops matching as DELETED, as real watches do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubeapi import errors
from tests.kubeapi.resources import ResourceInfo
from tests.kubeapi.store import Change, Matcher, Store

Event = dict[str, Any]
#: Longest sleep between checks of stop/pause, so drops and restarts act promptly.
_POLL_S = 0.1
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class WatchRequest:
    resource: ResourceInfo
    namespace: str | None
    matcher: Matcher
    resource_version: str
    timeout_s: float | None
    bookmarks: bool
    send_initial_events: bool


def parse_resource_version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(
            f"invalid resourceVersion {text!r}: use a resourceVersion from a list or an event"
        ) from None
    if value < 0:
        raise errors.bad_request(f"invalid resourceVersion {text!r}: must be a non-negative integer")
    return value


def _event(type_: str, resource: ResourceInfo, obj: Mapping[str, Any]) -> Event:
    return {"type": type_, "object": {**obj, "apiVersion": resource.api_version}}


def _bookmark(resource: ResourceInfo, rv: int, *, initial_end: bool = False) -> Event:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {
        "type": "BOOKMARK",
        "object": {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": meta},
    }


def _translate(request: WatchRequest, change: Change) -> Event | None:
    if change.storage_key != request.resource.storage_key:
        return None
    if request.namespace is not None and change.namespace != request.namespace:
        return None
    now = request.matcher(change.obj)
    before = change.prev is not None and request.matcher(change.prev)
    if change.type == "DELETED":
        return _event("DELETED", request.resource, change.obj) if before or now else None
    if now:
        return _event("MODIFIED" if before else "ADDED", request.resource, change.obj)
    if before:
        return _event("DELETED", request.resource, change.obj)
    return None


def stream(
    store: Store,
    request: WatchRequest,
    *,
    stopped: Callable[[], bool],
    paused: Callable[[], bool],
    bookmark_interval_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Event]:
    """Events until the timeout, `stopped()`, or a 410; pauses deliver nothing."""
    deadline = None if request.timeout_s is None else clock() + request.timeout_s
    initial: list[Event] = []
    if request.resource_version in ("", "0") or request.send_initial_events:
        last, objects = store.snapshot(request.resource, request.namespace, request.matcher)
        initial = [_event("ADDED", request.resource, obj) for obj in objects]
    else:
        last = parse_resource_version(request.resource_version)
    yield from initial
    if request.send_initial_events and request.bookmarks:
        yield _bookmark(request.resource, last, initial_end=True)
    next_bookmark = clock() + bookmark_interval_s
    while not stopped():
        now = clock()
        if deadline is not None and now >= deadline:
            return
        if request.bookmarks and now >= next_bookmark and not paused():
            next_bookmark = now + bookmark_interval_s
            yield _bookmark(request.resource, last)
            continue
        with store.cond:
            changes: list[Change] | None = []
            if not paused():
                changes = store.changes_after(last)
                current = store.rv
            if changes == []:
                limits = [_POLL_S, next_bookmark - now if request.bookmarks else _POLL_S]
                if deadline is not None:
                    limits.append(deadline - now)
                store.cond.wait(max(0.0, min(limits)))
                continue
        if changes is None:
            gone = errors.gone(f"too old resource version: {last} ({store.compacted_rv})")
            yield {"type": "ERROR", "object": gone.status()}
            return
        for change in changes:
            event = _translate(request, change)
            if event is not None:
                yield event
        last = current
