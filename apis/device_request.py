"""The normalized GPU request of a pod, `DeviceRequest`, and `RequestError` for one that is invalid.

A request is `gpus` cards, each with the same share of compute and memory; it
is what apis/request.py makes of a pod and what the scheduler places.

Example, `DeviceRequest.to_json()` of `gpu-core: 100, gpu-memory-ratio: 100, gpu.shared: 2`::

    {"gpus": 2, "core_percent": 50, "memory_bytes": null, "memory_ratio_percent": 50,
     "whole": false, "source": "koordinator"}

A burstable request (apis/overcommit.py) adds its limit on its one card::

    "limit": {"core_percent": 80, "memory_bytes": 21474836480, "memory_ratio_percent": null}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apis.pods import ContainerKind


@dataclass(frozen=True)
class Burst:
    """A burstable share's limits on its one card; the memory limit in the request's own kind."""

    core_percent: int
    #: set when the request gave bytes
    memory_bytes: int | None
    #: set when the request gave a ratio
    memory_ratio_percent: int | None

    def memory_bytes_on(self, gpu_memory_bytes: int) -> int:
        if self.memory_bytes is not None:
            return self.memory_bytes
        assert self.memory_ratio_percent is not None
        return gpu_memory_bytes * self.memory_ratio_percent // 100

    def to_json(self) -> dict[str, object]:
        return {"core_percent": self.core_percent, "memory_bytes": self.memory_bytes,
                "memory_ratio_percent": self.memory_ratio_percent}


@dataclass(frozen=True)
class DeviceRequest:
    """The GPUs a pod needs: `gpus` cards, each with the same share."""

    gpus: int
    #: Per card, 0..100; 0 asks for memory only.
    core_percent: int
    #: Per card, when the pod asked for bytes.
    memory_bytes: int | None
    #: Per card, when the pod asked for a ratio (100 for whole GPUs).
    memory_ratio_percent: int | None
    #: Each card is taken entirely: all of its compute and memory.
    whole: bool
    #: The rule that produced it: "koordinator", "nvidia", "hami", ...
    source: str
    #: Set for the burstable tier (apis/overcommit.py): what it may use above the request.
    limit: Burst | None = None

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"DeviceRequest.gpus: {self.gpus} must be at least 1")
        if not 0 <= self.core_percent <= 100:
            raise ValueError(f"DeviceRequest.core_percent: {self.core_percent} must be 0..100")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ValueError(f"DeviceRequest.memory_bytes: {self.memory_bytes} must be positive")
        if self.memory_ratio_percent is not None and not 1 <= self.memory_ratio_percent <= 100:
            raise ValueError(f"DeviceRequest.memory_ratio_percent: {self.memory_ratio_percent} must be 1..100")
        if self.memory_bytes is not None and self.memory_ratio_percent is not None:
            raise ValueError("DeviceRequest: give memory_bytes or memory_ratio_percent, not both")
        if self.memory_bytes is None and self.memory_ratio_percent is None:
            raise ValueError("DeviceRequest: one of memory_bytes or memory_ratio_percent is needed")
        if self.whole and (self.core_percent != 100 or self.memory_ratio_percent != 100):
            raise ValueError("DeviceRequest: whole=True needs core_percent=100 and memory_ratio_percent=100")
        if self.limit is not None:
            self._check_limit(self.limit)

    def _check_limit(self, limit: Burst) -> None:
        if self.whole or self.gpus != 1:
            raise ValueError("DeviceRequest.limit: a burstable request is a share of one card")
        if not self.core_percent <= limit.core_percent <= 100:
            raise ValueError(f"DeviceRequest.limit.core_percent: {limit.core_percent} must be core_percent..100")
        if self.memory_bytes is not None:
            if limit.memory_ratio_percent is not None or limit.memory_bytes is None or limit.memory_bytes < self.memory_bytes:
                raise ValueError("DeviceRequest.limit: memory_bytes at least the request's, and no ratio, beside a bytes request")
        elif limit.memory_bytes is not None or not (self.memory_ratio_percent or 0) <= (limit.memory_ratio_percent or 0) <= 100:
            raise ValueError("DeviceRequest.limit: memory_ratio_percent request..100, and no bytes, beside a ratio request")

    def memory_bytes_on(self, gpu_memory_bytes: int) -> int:
        """The bytes this request takes on each card of `gpu_memory_bytes` memory."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        assert self.memory_ratio_percent is not None  # __post_init__ guarantees one of the two
        return gpu_memory_bytes * self.memory_ratio_percent // 100

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "core_percent": self.core_percent,
            "memory_bytes": self.memory_bytes,
            "memory_ratio_percent": self.memory_ratio_percent,
            "whole": self.whole,
            "source": self.source,
            **({"limit": self.limit.to_json()} if self.limit is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DeviceRequest:
        """The inverse of to_json; a missing or mistyped field raises ValueError naming it."""

        def number(key: str, *, optional: bool = False, of: Mapping[str, object] = data) -> Any:
            value = of.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"DeviceRequest JSON: {key}: expected a whole number, got {value!r}")
            return value

        raw_limit = data.get("limit")
        limit = None
        if raw_limit is not None:
            if not isinstance(raw_limit, Mapping):
                raise ValueError(f"DeviceRequest JSON: limit: expected an object or null, got {raw_limit!r}")
            limit = Burst(
                core_percent=number("core_percent", of=raw_limit),
                memory_bytes=number("memory_bytes", optional=True, of=raw_limit),
                memory_ratio_percent=number("memory_ratio_percent", optional=True, of=raw_limit),
            )

        whole = data.get("whole", False)
        source = data.get("source", "")
        if not isinstance(whole, bool):
            raise ValueError(f"DeviceRequest JSON: whole: expected true or false, got {whole!r}")
        if not isinstance(source, str):
            raise ValueError(f"DeviceRequest JSON: source: expected text, got {source!r}")
        return cls(
            gpus=number("gpus"),
            core_percent=number("core_percent"),
            memory_bytes=number("memory_bytes", optional=True),
            memory_ratio_percent=number("memory_ratio_percent", optional=True),
            whole=whole,
            source=source,
            limit=limit,
        )


class RequestError(ValueError):
    """An invalid request; `errors` holds one message per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class ContainerRequest:
    """One container's own GPU request, for splitting the pod's allocation among its containers."""

    name: str
    kind: ContainerKind
    request: DeviceRequest
