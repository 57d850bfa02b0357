"""Replay records and the headline figures computed from them.

One record at the start and one after every pod (CPU-only and failed pods too), each holding
arrived % (GPU request of all pods submitted so far / capacity) and allocation % (allocated GPU /
capacity, rounded to 2 decimals). The headline is the mean allocation % over the records whose
arrived % rounds (half-even) to 100; when none does, the bin widens to 100 +- 1. A cluster so small
that one pod moves arrived % by more than that (a test cluster: a later record lies above the
window) falls back to the last record at or below 100% arrived, the allocation at the moment the
workload reached capacity. A run whose arrival never came near 100% has no headline (NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

HEADLINE_ARRIVED = 100.0
#: fragmentation is measured only where a headline bin can fall (and at the fallback record)
FRAG_WINDOW = (HEADLINE_ARRIVED - 1.5, HEADLINE_ARRIVED + 1.5)


@dataclass(frozen=True)
class Records:
    arrived_pct: tuple[float, ...]
    alloc_pct: tuple[float, ...]
    #: cluster fragmentation (% of capacity) per record; NaN where not measured
    frag_pct: tuple[float, ...]


def headline_mask(arrived_pct: Sequence[float]) -> npt.NDArray[np.bool_]:
    """Which records form the headline bin (see the module docstring)."""
    arrived = np.asarray(arrived_pct, dtype=np.float64)
    # np.round is half-even, as the protocol asks.
    mask: npt.NDArray[np.bool_] = np.round(arrived) == HEADLINE_ARRIVED
    if not mask.any():
        mask = np.abs(arrived - HEADLINE_ARRIVED) <= 1.0
    if not mask.any():
        below = np.flatnonzero(arrived <= HEADLINE_ARRIVED)
        # Only when one pod jumped across the window; a run that stopped short has no headline.
        if len(below) and (arrived[below[-1] + 1 :] > HEADLINE_ARRIVED + 1.0).any():
            mask[below[-1]] = True
    return mask


def headline(values: Sequence[float], arrived_pct: Sequence[float]) -> float:
    """Mean of `values` over the headline bin (NaN values, i.e. unmeasured records, skipped).

    NaN when the bin is empty: the run's arrival never came near 100%.
    """
    mask = headline_mask(arrived_pct)
    chosen = np.asarray(values, dtype=np.float64)[mask]
    chosen = chosen[~np.isnan(chosen)]
    return float(np.mean(chosen)) if len(chosen) else float("nan")


def curve(runs: Sequence[Records], *, step: float = 1.0) -> list[tuple[float, float]]:
    """Allocation % against arrived %, averaged over runs in bins of `step` points of arrived %."""
    arrived = np.concatenate([np.asarray(r.arrived_pct) for r in runs])
    alloc = np.concatenate([np.asarray(r.alloc_pct) for r in runs])
    bins = np.round(arrived / step).astype(np.int64)
    result: list[tuple[float, float]] = []
    for b in np.unique(bins):
        result.append((round(float(b * step), 2), round(float(alloc[bins == b].mean()), 2)))
    return result
