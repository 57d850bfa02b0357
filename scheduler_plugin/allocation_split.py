"""The per-container split the scheduler records in the allocation it signs (`apis.container_split`).

A pod with one GPU-asking container gives that container the pod's shares as they
are, without reading node state; only pods whose GPUs are split among several
containers need the GPUs' memory sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from apis.allocation import Allocation, ContainerShare
from apis.container_split import SplitError, split_allocation
from apis.request import container_requests
from apis.translation import TranslationRules
from scheduler_plugin.errors import InvalidRequest


def with_containers(
    pod: Mapping[str, Any],
    allocation: Allocation,
    *,
    rules: TranslationRules | None,
    gpu_memory: Callable[[], Mapping[str, int]],
    where: str,
) -> Allocation:
    """`allocation` naming the containers that see each GPU. Raises InvalidRequest when they do not fit it."""
    if not allocation.gpus:
        return allocation
    containers = container_requests(pod, rules=rules)
    if len(containers) == 1:
        name = containers[0].name
        return Allocation(gpus=tuple(
            replace(s, containers=(ContainerShare(name, s.core_percent, s.memory_bytes, s.memory_ratio_percent),))
            for s in allocation.gpus
        ))
    try:
        return split_allocation(allocation, containers, gpu_memory=gpu_memory())
    except SplitError as exc:
        raise InvalidRequest(f"pod {where}: {exc}") from exc
