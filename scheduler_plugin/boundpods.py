"""Counting a bound pod into the core from what is written on it.

A bound pod's GPUs are whatever its `device-allocated` annotation says, not
what its request would get today: the rules may have changed, the pod may
predate them. So the allocation is read from the annotation, the request only
supplies CPU/memory and the job key, and a pod whose request no longer parses
still has its GPUs counted. An allocation naming a GPU its node does not
report is returned as an orphan line (for a log line and a metric), and still
counted, so it is never silently dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from apis import names
from apis.allocation import Allocation, AllocationError, decode_allocation
from apis.devices import NodeDevices
from apis.signing import SignatureError, verify_allocation
from apis.translation import TranslationRules
from scheduler_plugin import pods
from scheduler_plugin.core.api import Core, NodeName

log = logging.getLogger(__name__)


def gpu_uuids(devices: NodeDevices) -> frozenset[str]:
    """Every GPU and MIG instance UUID a node reports."""
    out: set[str] = set()
    for gpu in devices.gpus:
        out.add(gpu.uuid)
        out.update(m.uuid for m in gpu.mig_instances)
    return frozenset(out)


def add_bound(
    core: Core,
    pod: Mapping[str, Any],
    *,
    gpus: Mapping[str, frozenset[str]],
    rules: TranslationRules | None,
    key: bytes | None,
) -> list[str]:
    """Counts `pod` (assigned to a node) in `core`; returns orphan lines for GPUs its node lacks."""
    node = NodeName(pods.node_name(pod))
    request, problem = pods.request_of_bound(pod, rules=rules)
    if problem:
        log.warning("bound pod %s: request not valid under current rules (%s); counting its allocation only", pods.key(pod), problem)
    annotations = pods.annotations_of(pod)
    allocation: Allocation | None = None
    text = annotations.get(names.DEVICE_ALLOCATED)
    if text:
        try:
            allocation = decode_allocation(text)
        except AllocationError as exc:
            log.error("bound pod %s on %s: unreadable %s annotation, GPUs not counted: %s", pods.key(pod), node, names.DEVICE_ALLOCATED, exc)
        else:
            _check_signature(pod, node=node, text=text, annotations=annotations, key=key)
    orphans: list[str] = []
    if allocation is not None and node in gpus:
        for share in allocation.gpus:
            uuid = share.mig_uuid or share.uuid
            if uuid and uuid not in gpus[node]:
                orphans.append(f"{pods.key(pod)}: {uuid} (node {node} has no such GPU)")
    core.add_pod(request, node, allocation)
    return orphans


def _check_signature(pod: Mapping[str, Any], *, node: str, text: str, annotations: Mapping[str, str], key: bytes | None) -> None:
    # Counted either way (the GPU may be in use), but a bad signature means
    # the agent will refuse the pod: worth a loud line.
    if key is None:
        return
    try:
        verify_allocation(
            key, pod_uid=pods.uid(pod), node_name=node, annotation=text, signature=annotations.get(names.ALLOCATION_SIGNATURE, "")
        )
    except SignatureError as exc:
        log.warning("bound pod %s on %s: allocation signature problem: %s", pods.key(pod), node, exc)
