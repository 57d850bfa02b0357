"""Which usage reads reclaim may count: a new sample, not the one it read before; a stale one is no data.

The NVML worker samples every `pollInterval` (and an NVML call may hang for a while); reclaim reads the
latest sample every `interval`, usually more often. Counting each read as an observation would make one
sample held for ten seconds look like ten seconds of pressure, and evict on it. So a read is judged by
the sample's sequence number (`agent.nodestate.UsageSample.seq`):

* a new number: a new sample, taken as seen now (within one reclaim interval of its writing);
* the number read before: nothing new, nothing to decide;
* the number read before, first seen more than `max_age_s` ago (the worker stopped writing), or a new
  number after such a gap: the data lapsed, and any pressure timed before it ends (its grace restarts
  with the next sample that shows pressure).

A read without a number (a sampler called in place, as tests wire it) is taken now: always new, never
stale.

Pure: the last sample seen is a frozen value passed in and returned; the clock is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LastSample:
    """The last sample reclaim counted: its number (None: none yet, or unnumbered) and when it was first seen."""

    seq: int | None = None
    seen_at: float | None = None


@dataclass(frozen=True)
class Reading:
    #: a sample not counted before: the decision runs on it
    new: bool
    #: no new sample came for longer than the sample's age limit: the pressure timed before it ends
    lapsed: bool
    last: LastSample


def judge(last: LastSample, seq: int | None, *, now: float, max_age_s: float) -> Reading:
    """What a read of the sample numbered `seq` (None: unnumbered, taken now) is worth at `now`."""
    if seq is None:
        return Reading(new=True, lapsed=False, last=LastSample(seen_at=now))
    lapsed = last.seen_at is not None and now - last.seen_at > max_age_s
    if seq == last.seq:
        return Reading(new=False, lapsed=lapsed, last=last)
    return Reading(new=True, lapsed=lapsed, last=LastSample(seq=seq, seen_at=now))
