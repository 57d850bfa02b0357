"""The run's JSON: counts, faults, checks, violations, latencies, recovery, RSS/fd slopes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.soak import invariants

if TYPE_CHECKING:
    from bench.soak.runner import Soak


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[k], 3)


def build(soak: Soak, *, recovery: dict[str, Any], leaks: dict[str, Any]) -> dict[str, Any]:
    st = soak.state
    genuine = [p for p in st.pods.values() if p.kind not in ("forged",)]
    ran = [p for p in st.pods.values() if p.running_at]
    calm = [p.running_at - p.created_at for p in genuine if p.running_at and not p.faulty]
    faulty = [p.running_at - p.created_at for p in genuine if p.running_at and p.faulty]
    slopes = {}
    for name, samples in sorted(st.samples.items()):
        last_pid = samples[-1][3]
        life = [(t, rss, fds) for t, rss, fds, pid in samples if pid == last_pid]
        slopes[name] = {
            "rss_kib_per_min": round(invariants.slope_per_min([(t, r) for t, r, _ in life]), 1),
            "fds_per_min": round(invariants.slope_per_min([(t, f) for t, _, f in life]), 2),
            "rss_kib_last": int(life[-1][1]), "fds_last": int(life[-1][2]), "samples": len(life),
        }
    kinds: dict[str, int] = {}
    for p in st.pods.values():
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    return {
        "seed": soak.o.seed,
        "churn_s": soak.o.seconds,
        "nodes": soak.o.nodes,
        "shapes_from": soak.shape_source,
        "pods_created": st.created,
        "pods_by_kind": kinds,
        "pods_run": len(ran),
        "pods_deleted": st.deleted,
        "allocations_forged": st.forged,
        "allocations_edited": st.edited,
        "faults": dict(sorted(st.faults.items())),
        "faults_total": sum(st.faults.values()),
        "fault_log": st.fault_log,
        "checks": dict(st.checks),
        "violations": st.violations,
        "create_to_running_s": {
            "without_faults": {"n": len(calm), "p50": percentile(calm, 50), "p99": percentile(calm, 99)},
            "with_faults": {"n": len(faulty), "p50": percentile(faulty, 50), "p99": percentile(faulty, 99)},
        },
        "recovery": recovery,
        "leaks": leaks,
        "daemons": slopes,
    }
