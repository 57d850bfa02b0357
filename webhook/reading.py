"""Reading a pod's resources for the decisions, directly or memoized.

The decisions (webhook/mutating.py, webhook/validating.py) ask a `PodReader`
two questions: which GPU resources the pod asks for, and the `fgpuctl
validate` verdict on it (apis/pod_check.py). `DIRECT` answers them each time.
`MemoReader` remembers the answers by the part of the pod they depend on
(`apis.pod_check.resources_fingerprint`) and the rules: replicas created
together (a Job of 200 pods) are read once. Memoizing changes no answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

from apis import pod_check
from apis.pod_check import PodCheck
from apis.translation import TranslationRules


class PodReader(Protocol):
    def gpu_resources(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> tuple[str, ...]: ...

    def check(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> PodCheck: ...


class DirectReader:
    def gpu_resources(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> tuple[str, ...]:
        return pod_check.gpu_resources(pod, rules=rules)

    def check(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> PodCheck:
        return pod_check.check_pod(pod, rules=rules)


DIRECT = DirectReader()


class MemoReader:
    """The answers of the last `size` distinct pod shapes; a new rules object starts afresh."""

    def __init__(self, *, size: int = 1024) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._rules: TranslationRules | None = None
        self._resources: OrderedDict[Hashable, tuple[str, ...]] = OrderedDict()
        self._checks: OrderedDict[Hashable, PodCheck] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def gpu_resources(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> tuple[str, ...]:
        key = self._key(pod, rules)
        if key is not None:
            with self._lock:
                found = self._resources.get(key)
                if found is not None:
                    self._resources.move_to_end(key)
                    self.hits += 1
                    return found
        answer = pod_check.gpu_resources(pod, rules=rules)
        self._store(self._resources, key, answer, rules)
        return answer

    def check(self, pod: Mapping[str, Any], *, rules: TranslationRules) -> PodCheck:
        key = self._key(pod, rules)
        if key is not None:
            with self._lock:
                found = self._checks.get(key)
                if found is not None:
                    self._checks.move_to_end(key)
                    self.hits += 1
                    return found
        answer = pod_check.check_pod(pod, rules=rules)
        self._store(self._checks, key, answer, rules)
        return answer

    def _key(self, pod: Mapping[str, Any], rules: TranslationRules) -> Hashable | None:
        with self._lock:
            if rules is not self._rules:  # reloaded rules may read the same pod otherwise
                self._rules = rules
                self._resources.clear()
                self._checks.clear()
        return pod_check.resources_fingerprint(pod)

    def _store(
        self, table: OrderedDict[Hashable, Any], key: Hashable | None, answer: object, rules: TranslationRules
    ) -> None:
        with self._lock:
            self.misses += 1
            if key is None or rules is not self._rules:  # the rules changed meanwhile: the table is theirs now
                return
            table[key] = answer
            while len(table) > self._size:
                table.popitem(last=False)
