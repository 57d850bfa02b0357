"""Hook server registrations: YAML files in a directory the proxy watches.

    # /etc/fgpu/hooks.d/10-fgpu-agent.yaml (hack/systemd/10-fgpu-agent-hook.yaml)
    hooks:
      - name: fgpu-agent
        endpoint: unix:///var/run/fgpu-agent/hooks.sock
        stages: [PreCreateContainer, PostStopPodSandbox]
        failurePolicy: Ignore      # or Fail, the default when the key is left out
        timeout: 2s                # per call; a number of seconds or a Go duration: 500ms, 2s, 1m

failurePolicy says what a failed or timed-out call does to the CRI call: Fail
refuses a Pre* call, Ignore skips the hook. A container whose pod carries a
GPU allocation is refused at PreCreateContainer whenever a hook fails, under
either policy (runtimeproxy/verdicts.py), so the GPU hook registers with Ignore:
while it is down, every other pod on the node (CNI, kube-proxy, ...) is still
created, with NVIDIA_VISIBLE_DEVICES=void. A hook that registers without the
key gets Fail, the safe default for a hook whose edits every pod needs.

The stages are the RuntimeHooks methods (`runtimeproxy.stages`, read from
hooks.proto). A file may also hold a single registration (the mapping without `hooks:`).
Servers are called in file-name order, then in order within a file, and
their edits compose in that order. A file that does not parse keeps its last
good content (or contributes nothing), and the error is logged.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apis import config_yaml, durations
from apis.grpc_server import AddressError, parse_address
from runtimeproxy.errors import ConfigError
from runtimeproxy.stages import RUNTIME_HOOKS, Stage, Stages

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml", ".json")
DEFAULT_TIMEOUT_S = 2.0
#: More than zero (a zero timeout fails every call) and at most a day: far longer than any call or
#: interval should take, far below what a timer accepts.
BOUNDS = durations.Bounds(maximum=durations.DAY)


class FailurePolicy(enum.Enum):
    """What a failed or timed-out hook call does to the CRI call."""

    FAIL = "Fail"
    IGNORE = "Ignore"


@dataclass(frozen=True)
class HookServer:
    name: str
    endpoint: str
    stages: frozenset[Stage]
    failure_policy: FailurePolicy
    timeout_s: float
    #: the file it came from, for messages
    source: str = ""


def parse_duration(value: object, *, field: str, example: str = "2s") -> float:
    """Seconds of a proxy timeout or interval (`apis.durations`: a number, or Go's form such as
    500ms, 2s, 1m30s): more than zero, at most a day."""
    try:
        return durations.parse(value, field=field, bounds=BOUNDS, example=example)
    except durations.DurationError as err:
        raise ConfigError(str(err)) from None


def parse_hook(entry: object, *, where: str, stages: Stages = RUNTIME_HOOKS) -> HookServer:
    """One registration; ConfigError naming the file, entry, field and value on bad input."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping with name, endpoint and stages, got {type(entry).__name__}")
    known = {"name", "endpoint", "stages", "failurePolicy", "timeout"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(known)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name={name!r}: give each hook server a non-empty name")
    where = f"{where} ({name})"
    endpoint = entry.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise ConfigError(f"{where}.endpoint={endpoint!r}: expected unix:///PATH, e.g. unix:///var/run/fgpu-agent/hooks.sock")
    try:
        parse_address(endpoint, field=f"{where}.endpoint")
    except AddressError as exc:
        raise ConfigError(str(exc)) from exc
    stages_raw = entry.get("stages")
    if not isinstance(stages_raw, Sequence) or isinstance(stages_raw, str) or not stages_raw:
        raise ConfigError(
            f"{where}.stages={stages_raw!r}: expected a non-empty list of {list(stages)}"
        )
    chosen = set()
    for raw in stages_raw:
        stage = stages.get(raw) if isinstance(raw, str) else None
        if stage is None:
            raise ConfigError(f"{where}.stages: unknown stage {raw!r}; one of {list(stages)}")
        chosen.add(stage)
    policy_raw = entry.get("failurePolicy", FailurePolicy.FAIL.value)
    try:
        policy = FailurePolicy(policy_raw)
    except ValueError:
        raise ConfigError(f"{where}.failurePolicy={policy_raw!r}: expected Fail or Ignore") from None
    timeout_s = parse_duration(entry.get("timeout", DEFAULT_TIMEOUT_S), field=f"{where}.timeout")
    return HookServer(
        name=name, endpoint=endpoint, stages=frozenset(chosen), failure_policy=policy, timeout_s=timeout_s,
        source=where.split(":")[0],
    )


def parse_file(path: str, *, stages: Stages = RUNTIME_HOOKS) -> list[HookServer]:
    try:
        doc: Any = config_yaml.load_file(path)
    except config_yaml.YAMLFileError as exc:
        raise ConfigError(str(exc)) from None
    if doc is None:
        return []
    if isinstance(doc, Mapping) and "hooks" in doc:
        entries = doc["hooks"]
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: hooks must be a list of registrations")
        return [parse_hook(e, where=f"{path}: hooks[{i}]", stages=stages) for i, e in enumerate(entries)]
    return [parse_hook(doc, where=f"{path}:", stages=stages)]


class HookRegistry:
    """The current registrations of a directory, re-read when its files change.

    `refresh()` is cheap when nothing changed (one `stat` per file), so the
    proxy calls it on a timer. `stages` are the ones a registration may name.
    """

    def __init__(self, directory: str | None, *, stages: Stages = RUNTIME_HOOKS) -> None:
        self.directory = directory
        self.stages = stages
        self._files: dict[str, tuple[tuple[int, int], list[HookServer]]] = {}
        self._servers: tuple[HookServer, ...] = ()
        self._by_stage: dict[Stage, tuple[HookServer, ...]] = {s: () for s in stages.values()}
        self.errors: dict[str, str] = {}
        self.generation = 0
        self.refresh()

    def servers(self, stage: Stage | None = None) -> tuple[HookServer, ...]:
        return self._servers if stage is None else self._by_stage.get(stage, ())

    def refresh(self) -> bool:
        """Re-reads changed files; True when the registrations changed."""
        if not self.directory or not os.path.isdir(self.directory):
            changed = bool(self._files)
            self._files.clear()
            if changed:
                self._rebuild()
            return changed
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(SUFFIXES) and not n.startswith("."))
        changed = False
        seen = set()
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            seen.add(name)
            sig = (st.st_mtime_ns, st.st_size)
            old = self._files.get(name)
            if old is not None and old[0] == sig:
                continue
            try:
                servers = parse_file(path, stages=self.stages)
            except (ConfigError, OSError) as exc:
                if self.errors.get(name) != str(exc):
                    log.error("hook config rejected, keeping its last good content file=%s error=%r", path, str(exc))
                self.errors[name] = str(exc)
                # remember the signature so the same broken file is not re-parsed every tick
                self._files[name] = (sig, old[1] if old else [])
                continue
            self.errors.pop(name, None)
            self._files[name] = (sig, servers)
            changed = True
        for name in list(self._files):
            if name not in seen:
                del self._files[name]
                self.errors.pop(name, None)
                changed = True
        if changed:
            self._rebuild()
        return changed

    def _rebuild(self) -> None:
        ordered: list[HookServer] = []
        names: set[str] = set()
        for file_name in sorted(self._files):
            for server in self._files[file_name][1]:
                if server.name in names:
                    log.error("duplicate hook server name ignored name=%s file=%s", server.name, file_name)
                    continue
                names.add(server.name)
                ordered.append(server)
        self._servers = tuple(ordered)
        self._by_stage = {s: tuple(x for x in ordered if s in x.stages) for s in self.stages.values()}
        self.generation += 1
        log.info("hook servers loaded servers=%s", ",".join(f"{s.name}:{sorted(x.name for x in s.stages)}" for s in ordered))
