"""The MIG pool simulation (bench/mig.py) on a few hand-made pods: static, first-fit and fgpu agree with hand counts."""

from __future__ import annotations

import pytest

from scheduler_plugin.sim import mig_pool
from scheduler_plugin.sim.mig_pool import PoolPod


def pods(*millis: int) -> list[PoolPod]:
    return [PoolPod(f"p{i}", m) for i, m in enumerate(millis)]


@pytest.mark.parametrize(("milli", "profile"), [(1000, "7g.80gb"), (550, "7g.80gb"), (470, "3g.40gb"), (320, "3g.40gb"),
                                                 (230, "1g.20gb"), (140, "1g.20gb"), (110, "1g.10gb"), (50, "1g.10gb")])
def test_shares_map_to_the_smallest_profile_whose_memory_holds_them(milli: int, profile: str) -> None:
    found = mig_pool.profile_for(PoolPod("p", milli))
    assert found is not None and found.name == profile


def test_each_strategy_on_one_node_counts_what_a_person_counts() -> None:
    # 8 GPUs: ten 3g pods and a 7g. Static halves holds 16 3g but no 7g; dynamic placement holds all.
    workload = pods(*([470] * 10), 1000)
    results = {s: mig_pool.run(s, workload, 8).to_json() for s in ("static:halves", "static:whole", "first-fit", "fgpu")}

    assert results["static:halves"]["placed"] == 10 and results["static:halves"]["stranded_slices"] == 8
    assert results["static:whole"]["placed"] == 8 and results["static:whole"]["internal_waste_slices"] == 8 * (7 - 3)
    for dynamic in ("first-fit", "fgpu"):
        assert results[dynamic]["placed"] == 11
        assert results[dynamic]["instances"] == {"3g.40gb": 10, "7g.80gb": 1}
        assert results[dynamic]["internal_waste_slices"] == 0


def test_an_unknown_strategy_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="first-fit, fgpu, static:balanced"):
        mig_pool.run("best-fit", pods(100), 8)
