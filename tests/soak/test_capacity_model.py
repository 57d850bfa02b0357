"""Found by the 30-minute soak (seed 11, --rate 1.3, step 2188): "10 pods that fit were still Pending 90 s
after the faults stopped". Every one of them asked for a whole GPU or 81%.

The harness, not the scheduler: its model of free capacity counted only allocations that verify, so a
forged pod (pasted onto a node with a hand-written or replayed allocation) and an edited pod held
nothing in it. fgpu-scheduler by design counts such a pod's request on the GPUs its annotation names
(`scheduler_plugin/boundpods.py`, rules 1-2): the pod runs there. On a nearly full cluster one GPU
shared with a forged pod's 50% looked free to the harness, so every large pending pod "fit", while
the scheduler rightly found no room (its allocated-core gauges agreed with the API: the
scheduler-counts check passed in that run). These tests pin the harness's model to the scheduler's.
"""

from __future__ import annotations

from typing import Any

from bench.soak import adapter, invariants, workload
from bench.soak.stack import GPU

GIB = 2**30
NODE = "n0"
A, B = "GPU-a", "GPU-b"
GPUS = {NODE: [GPU(A, 0, 80 * GIB), GPU(B, 1, 80 * GIB)]}


def _pod(kind: str, shape: workload.Shape, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = workload.pod_manifest(step=1, kind=kind, shape=shape)
    pod["metadata"]["uid"] = f"uid-{kind}"
    pod["metadata"]["annotations"] = annotations or {}
    return pod


def test_a_forged_pods_claim_fills_the_gpu_it_names_so_a_large_pod_does_not_fit_there() -> None:
    forged = workload.forged_manifest(step=2, node=NODE, uuid=B, minor=1, memory_bytes=80 * GIB, replay_from=None)
    claim = invariants.claim_of(NODE, forged)
    assert claim == invariants.Claim(node=NODE, uuids=(B,), gpus=1, core=50, ratio=50)
    # GPU A is held whole by a verified pod; B only by the forged pod (its allocation does not verify).
    bound = [(NODE, (adapter.Share(A, 100, 80 * GIB),)), (NODE, ())]
    free = invariants.free_capacity(bound, GPUS, set(), [claim])
    assert free[NODE] == {A: (0, 0), B: (50, 50)}
    assert not invariants.fits(_pod("plain", workload.Shape(1, 1000)), free)
    assert not invariants.fits(_pod("plain", workload.Shape(1, 810)), free)
    assert invariants.fits(_pod("plain", workload.Shape(1, 470)), free)


def test_an_edited_pod_still_holds_its_request_on_its_gpu() -> None:
    signed_text = adapter.forged_allocation(uuid=A, minor=0, core=30, memory_bytes=24 * GIB, container="main")
    edited = _pod("edited", workload.Shape(1, 300),
                  annotations={adapter.DEVICE_ALLOCATED: adapter.edited_allocation(signed_text)})
    claim = invariants.claim_of(NODE, edited)
    assert claim is not None and (claim.uuids, claim.core) == ((A,), 30)
    free = invariants.free_capacity([(NODE, ())], {NODE: GPUS[NODE][:1]}, set(), [claim])
    assert free[NODE][A] == (70, 70)
    assert not invariants.fits(_pod("plain", workload.Shape(1, 810)), free)


def test_a_claim_is_cut_to_what_verified_pods_leave_and_never_counts_more_gpus_than_requested() -> None:
    whole = adapter.forged_allocation(uuid=A, minor=0, core=100, memory_bytes=80 * GIB, container="main")
    pod = _pod("forged", workload.Shape(1, 600), annotations={adapter.DEVICE_ALLOCATED: whole})
    claim = invariants.claim_of(NODE, pod)
    assert claim is not None
    bound = [(NODE, (adapter.Share(A, 70, 56 * GIB),))]
    free = invariants.free_capacity(bound, GPUS, set(), [claim, invariants.Claim(NODE, (A, B), 1, 10, 10)])
    assert free[NODE][A] == (0, 0)  # 30 left, cut to it; the second claim's one GPU is A, already full
    assert free[NODE][B] == (100, 100)
    assert invariants.fits(_pod("plain", workload.Shape(1, 1000)), free)


def test_a_pod_asking_for_no_gpu_claims_nothing_and_always_fits() -> None:
    cpu = _pod("plain", workload.Shape(0, 0), annotations={
        adapter.DEVICE_ALLOCATED: adapter.forged_allocation(uuid=A, minor=0, core=100, memory_bytes=GIB, container="main")})
    assert invariants.claim_of(NODE, cpu) is None
    assert invariants.fits(cpu, {NODE: {}})
