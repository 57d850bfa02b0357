"""Writes the node's Device object and node status/labels, only when they differ.

Each pass reads the Node and the Device (two GETs), compares with what the
devices say (`agent.node_report`) and writes what differs: the Device is
created when missing (also after someone deleted it), replaced on change
with the read resourceVersion, and re-read and retried on a 409 conflict.
API failures propagate as KubeAPIError; `agent.resync_loop` retries them with
backoff.
"""

from __future__ import annotations

import logging

from agent import node_report
from agent.errors import KubeAPIError
from agent.kube import JSON, Kube
from apis.devices import NodeDevices

log = logging.getLogger(__name__)

#: Conflicts in a row before the pass gives up (and the loop backs off).
CONFLICT_RETRIES = 5


class KubeReporter:
    def __init__(self, kube: Kube, *, node_name: str, advertise_nvidia_gpu: bool = False) -> None:
        self._kube = kube
        self._node = node_name
        self._advertise = advertise_nvidia_gpu
        self._warned_no_node = False
        #: What the last pass wrote, by kind ("device", "node-status", "node-labels"); for tests and logs.
        self.writes: dict[str, int] = {}

    def report(self, devices: NodeDevices) -> None:
        node = self._kube.get_node(self._node)
        if node is None and not self._warned_no_node:
            log.warning("node %s does not exist in the API; is --node-name right? The Device has no owner until it does",
                        self._node)
            self._warned_no_node = True
        node_uid = ((node or {}).get("metadata") or {}).get("uid")
        self._write_device(node_report.desired_device(devices, node_uid=node_uid))
        if node is None:
            return
        self._warned_no_node = False
        labels = node_report.node_labels_patch(node, node_report.node_labels(devices))
        if labels:
            self._kube.patch_node_labels(self._node, labels)
            self._count("node-labels")
        status = node_report.node_status_patch(
            node, node_report.node_resources(devices, advertise_nvidia_gpu=self._advertise)
        )
        if status:
            self._kube.patch_node_status(self._node, status)
            self._count("node-status")

    def _write_device(self, desired: JSON) -> None:
        for _ in range(CONFLICT_RETRIES):
            current = self._kube.get_device(self._node)
            try:
                if current is None:
                    self._kube.create_device(desired)
                    log.info("created Device %s", self._node)
                elif node_report.device_differs(current, desired):
                    self._kube.replace_device(self._node, node_report.merged_device(current, desired))
                else:
                    return
            except KubeAPIError as err:
                # 409: someone wrote in between (or created it first); 404: deleted in between. Read again.
                if err.status in (404, 409):
                    log.info("Device %s changed while writing it (%s); reading it again", self._node, err)
                    continue
                raise
            self._count("device")
            return
        raise KubeAPIError(f"Device {self._node}: still conflicting after {CONFLICT_RETRIES} attempts", status=409)

    def _count(self, kind: str) -> None:
        self.writes[kind] = self.writes.get(kind, 0) + 1
