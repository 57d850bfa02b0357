"""The descheduler's door to the API: the scheduler's `Kube` (pods, nodes, Devices, budgets, owners,
the Eviction subresource, namespaces) plus what the evictor records and reads back.

* Events on the pods it moves (`record_event`), with the node it moved them from as the Event's
  `related` object, so `recent_moves` can rebuild the last hour's per-node counts at start.
  Events are only what the descheduler itself wrote (`reportingComponent`); anyone able to write
  Events could add look-alikes, which only lowers the budget left (never raises it).
* The stop (`save_stop` / `saved_stop`): a ConfigMap `fgpu-descheduler-stopped` in its own
  namespace, which tenants cannot write, read at start. Delete it and restart to resume.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from apis import names
from scheduler_plugin.errors import KubeAPIError
from scheduler_plugin.kube import Kube

_TIME = "%Y-%m-%dT%H:%M:%SZ"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _parse_time(text: Any) -> datetime.datetime | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def moves_of(events: Sequence[Mapping[str, Any]], *, reason: str, since: datetime.datetime) -> list[tuple[datetime.datetime, str]]:
    """(when, node) of this descheduler's Events of `reason` since `since` (pure)."""
    found: list[tuple[datetime.datetime, str]] = []
    for event in events:
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        if event.get("reason") != reason or source != names.DESCHEDULER_NAME:
            continue
        when = _parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))
        node = str((event.get("related") or {}).get("name") or "")
        if when is None or when < since:
            continue
        found.append((when, node))
    return found


class DeschedulerKube(Kube):
    #: where the stop is recorded: the descheduler's own namespace (main.py sets it)
    state_namespace = "default"

    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str, node: str = "") -> None:
        now = _utcnow().strftime(_TIME)
        body: dict[str, Any] = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": "Normal",
            "action": "Evict",
            "source": {"component": names.DESCHEDULER_NAME},
            "reportingComponent": names.DESCHEDULER_NAME,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if node:
            body["related"] = {"kind": "Node", "name": node, "apiVersion": "v1"}
        self.create_event(namespace, body)

    def recent_moves(self, *, reason: str, since: datetime.datetime) -> list[tuple[datetime.datetime, str]]:
        return moves_of(self.list_events(field_selector=f"reason={reason}").items, reason=reason, since=since)

    def saved_stop(self) -> str:
        found = self.get_config_map(namespace=self.state_namespace, name=names.DESCHEDULER_STOP_CONFIGMAP)
        if found is None:
            return ""
        data = found.get("data") or {}
        reason = str(data.get(names.DESCHEDULER_STOP_REASON_KEY) or "no reason recorded")
        since = data.get(names.DESCHEDULER_STOP_SINCE_KEY) or "?"
        return f"{reason} (recorded {since} in ConfigMap {self.state_namespace}/{names.DESCHEDULER_STOP_CONFIGMAP})"

    def save_stop(self, reason: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": names.DESCHEDULER_STOP_CONFIGMAP,
                "namespace": self.state_namespace,
                "labels": {"app.kubernetes.io/name": names.DESCHEDULER_NAME},
            },
            "data": {names.DESCHEDULER_STOP_REASON_KEY: reason[:4096], names.DESCHEDULER_STOP_SINCE_KEY: _utcnow().strftime(_TIME)},
        }
        try:
            self.create_config_map(namespace=self.state_namespace, body=body)
        except KubeAPIError as exc:
            if exc.status != 409:  # one recorded already: the first reason stands
                raise
