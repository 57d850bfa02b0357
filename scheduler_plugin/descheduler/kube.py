"""The descheduler's door to the API: the scheduler's `Kube` (pods, nodes, Devices, budgets, the
Eviction subresource, namespaces) plus the Events it records on the pods it moves."""

from __future__ import annotations

import datetime

from apis import names
from scheduler_plugin.kube import Kube


class DeschedulerKube(Kube):
    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.create_event(
            namespace,
            {
                "metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid, "apiVersion": "v1"},
                "reason": reason,
                "message": message,
                "type": "Normal",
                "source": {"component": names.DESCHEDULER_NAME},
                "reportingComponent": names.DESCHEDULER_NAME,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )
