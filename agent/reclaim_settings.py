"""A node pool's overcommit settings: one YAML file (the pool's ConfigMap), re-read when it changes.

    # /etc/fgpu/overcommit.yaml, named by the agent config's `overcommit:` key
    ratio: 1.5              # what the pool's nodes carry as fgpu.io/burstable-ratio (the scheduler's rule)
    highWater: 0.95         # evict burstable pods when a GPU's memory in use reaches this fraction
    pressureGrace: 5s       # pressure must last this long first
    cooldown: 30s           # per GPU, after an eviction
    evictionGrace: 30s      # the longest termination grace an evicted pod gets (its own, capped); >= 1s
    retry: 60s              # a pod whose eviction was refused may be chosen again after this
    interval: 1s            # how often the reclaim loop looks
    dryRun: false           # decide and report, never evict

Every key is optional. A bad value is refused with the key, the value and the fix; on a reload the
last good settings stay in force and the error is reported (`SettingsFile.reload`), so a typo in
the ConfigMap never switches reclaim off.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.errors import ConfigError
from agent.reclaim import MIN_EVICTION_GRACE_S, ReclaimPolicy
from apis import config_yaml, durations

_MAX_RATIO = 10.0
#: kubelet's default termination grace: long enough for a clean shutdown, short enough to get the memory back
_DEFAULT_EVICTION_GRACE_S = 30
_MAX_EVICTION_GRACE_S = 3600
#: How often the loop looks: 0 would spin it.
_INTERVAL = durations.Bounds(maximum=durations.YEAR)
#: Graces, cooldowns and retries: 0 means "at once".
_WAIT = durations.Bounds(maximum=durations.YEAR, zero=True)
_EVICTION_GRACE = durations.Bounds(
    minimum=MIN_EVICTION_GRACE_S,
    maximum=_MAX_EVICTION_GRACE_S,
    why_minimum="0 would force-delete the pod while its processes still hold the GPU's memory",
    why_maximum="a guaranteed pod's memory stays at risk while an evicted pod terminates",
)


@dataclass(frozen=True)
class OvercommitSettings:
    ratio: float = 1.0
    policy: ReclaimPolicy = field(default_factory=ReclaimPolicy)
    interval_s: float = 1.0
    dry_run: bool = False


def parse(data: object, *, source: str) -> OvercommitSettings:
    """Settings from the file's YAML value; raises ConfigError naming the key, value and fix."""
    if data is None:
        return OvercommitSettings()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys such as ratio: 1.5, got {type(data).__name__}")
    known = ("ratio", "highWater", "pressureGrace", "cooldown", "evictionGrace", "retry", "interval", "dryRun")
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r}; valid keys are {', '.join(known)}")
    ratio = _number(data, "ratio", 1.0, source=source, low=1.0, high=_MAX_RATIO, example="1.5")
    high = _number(data, "highWater", 0.95, source=source, low=0.5, high=1.0, example="0.95")
    dry_run = data.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise ConfigError(f"{source}: dryRun={dry_run!r}: expected true or false")
    eviction_grace = _duration(data, "evictionGrace", _DEFAULT_EVICTION_GRACE_S, source=source,
                               bounds=_EVICTION_GRACE, example="30s")
    interval = _duration(data, "interval", 1.0, source=source, bounds=_INTERVAL, example="1s")
    return OvercommitSettings(
        ratio=ratio,
        policy=ReclaimPolicy(
            high_water=high,
            pressure_grace_s=_duration(data, "pressureGrace", 5.0, source=source, bounds=_WAIT, example="5s"),
            cooldown_s=_duration(data, "cooldown", 30.0, source=source, bounds=_WAIT, example="30s"),
            eviction_grace_s=math.ceil(eviction_grace),
            retry_s=_duration(data, "retry", 60.0, source=source, bounds=_WAIT, example="60s"),
        ),
        interval_s=interval,
        dry_run=dry_run,
    )


def _number(data: Mapping[str, object], key: str, default: float, *, source: str, low: float, high: float,
            example: str) -> float:
    raw = data.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not low <= float(raw) <= high:
        raise ConfigError(f"{source}: {key}={raw!r}: expected a number from {low:g} to {high:g}, e.g. {example}")
    return float(raw)


def _duration(data: Mapping[str, object], key: str, default: float, *, source: str, bounds: durations.Bounds,
              example: str) -> float:
    if key not in data:
        return default
    try:
        return durations.parse(data[key], field=f"{source}: {key}", bounds=bounds, example=example)
    except durations.DurationError as err:
        raise ConfigError(str(err)) from None


class SettingsFile:
    """The file, re-read when its modification time or size changes; the last good value otherwise."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self.current = OvercommitSettings()
        #: True once the file has read cleanly; until then `current` is only the defaults
        self.loaded = False
        #: the last reload's error ("" when the file read cleanly)
        self.error = ""

    def reload(self) -> bool:
        """Re-reads the file if it changed; True when the settings changed. Never raises."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            kept = "keeping the settings in force" if self.loaded else "reclaim waits for the file"
            self.error = f"{self.path}: cannot read it ({exc.strerror}); {kept}"
            return False
        stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            settings = parse(config_yaml.load_file(self.path), source=self.path)
        except (config_yaml.YAMLFileError, ConfigError) as exc:
            kept = "keeping the settings in force" if self.loaded else "reclaim waits for a valid file"
            self.error = f"{exc}; {kept}"
            return False
        self.error = ""
        changed = settings != self.current or not self.loaded
        self.current = settings
        self.loaded = True
        return changed
