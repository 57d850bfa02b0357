from __future__ import annotations

from pathlib import Path

import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.sim.trace import TracePod, read_nodes, read_pods
from scheduler_plugin.sim.variants import VariantError, VariantSpec, make_variant, stats
from tests.simulator.helpers import NODES_CSV, node, pod

NODES = read_nodes(NODES_CSV)


def base_sample() -> list[TracePod]:
    """400 pods in the default trace's proportions: CPU-only, shares, whole 1-GPU and a few multi-GPU pods."""
    pods: list[TracePod] = []
    for i in range(400):
        kind = i % 20
        if kind < 3:
            pods.append(pod(f"p{i:04d}", cpu=8000 + 1000 * (i % 5)))
        elif kind < 11:
            pods.append(pod(f"p{i:04d}", milli=(250, 470, 500, 810)[i % 4], cpu=2000 + 1000 * (i % 3)))
        elif kind < 19:
            pods.append(pod(f"p{i:04d}", milli=1000, cpu=4000 + 2000 * (i % 2)))
        else:
            pods.append(pod(f"p{i:04d}", milli=1000, gpus=(2, 4, 8)[i % 3], cpu=16000))
    return pods


def constraint_source() -> list[TracePod]:
    return [
        pod("s1", milli=1000, spec=("T4",)),
        pod("s2", milli=1000, spec=("T4",)),
        pod("s3", milli=500, spec=("G2", "V100M32")),
        pod("s4", milli=500, spec=("P100",)),
        pod("s5", milli=500),
    ]


BASE = base_sample()
BASE_TOTAL = stats(BASE).gpu_milli
LARGEST = max(p.total_gpu_milli for p in BASE)


@pytest.mark.parametrize("share", [0.0, 0.2, 0.35, 0.6])
def test_the_constrained_share_is_met_with_lists_that_occur_and_can_run(share: float) -> None:
    variant = make_variant(
        BASE, nodes=NODES, spec=VariantSpec(constrained=share, seed=1), constraint_source=constraint_source()
    )
    measured = stats(variant)
    assert measured.constrained == pytest.approx(share, abs=1 / measured.gpu_pods)
    occurring = {p.gpu_spec for p in constraint_source() if p.gpu_spec}
    for p in variant:
        if p.gpu_spec:
            assert p.gpu_spec in occurring
            # An 8-GPU pod can't run on the 2-GPU T4 nodes: it never gets T4 alone.
            assert any(n.model in p.gpu_spec and n.gpus >= p.num_gpu for n in NODES), p
    assert measured.gpu_milli == BASE_TOTAL, "constraints change no request"


@pytest.mark.parametrize("share", [0.0, 0.25, 0.7, 1.0])
def test_the_sharing_share_holds_and_the_gpu_total_stays_the_bases(share: float) -> None:
    variant = make_variant(BASE, nodes=NODES, spec=VariantSpec(sharing=share, seed=2))
    measured = stats(variant)
    assert measured.sharing == pytest.approx(share, abs=0.05)
    assert abs(measured.gpu_milli - BASE_TOTAL) <= LARGEST / 2
    shares = {(p.cpu_milli, p.gpu_milli) for p in BASE if p.num_gpu == 1 and p.gpu_milli < 1000}
    assert {(p.cpu_milli, p.gpu_milli) for p in variant if p.num_gpu == 1 and p.gpu_milli < 1000} <= shares


@pytest.mark.parametrize("share", [0.0, 0.2, 0.6])
def test_the_multi_gpu_share_holds_with_the_bases_multi_gpu_shapes(share: float) -> None:
    variant = make_variant(BASE, nodes=NODES, spec=VariantSpec(multi_gpu=share, seed=3))
    measured = stats(variant)
    assert measured.multi_gpu == pytest.approx(share, abs=0.05)
    assert abs(measured.gpu_milli - BASE_TOTAL) <= LARGEST / 2
    assert {p.num_gpu for p in variant if p.num_gpu > 1} <= {2, 4, 8}


@pytest.mark.parametrize("factor", [0.0, 1.0, 3.0])
def test_the_cpu_only_population_scales_without_touching_gpu_pods(factor: float) -> None:
    variant = make_variant(BASE, nodes=NODES, spec=VariantSpec(cpu_only=factor, seed=4))
    measured = stats(variant)
    assert measured.cpu_only_pods == round(factor * stats(BASE).cpu_only_pods)
    assert sorted((p for p in variant if p.num_gpu), key=lambda p: p.name) == [p for p in BASE if p.num_gpu]
    assert len({p.name for p in variant}) == len(variant), "added pods get names of their own"


def test_a_variant_is_reproducible_from_its_seed() -> None:
    spec = VariantSpec(sharing=0.8, constrained=0.3, seed=7)
    first = make_variant(BASE, nodes=NODES, spec=spec, constraint_source=constraint_source())
    assert first == make_variant(BASE, nodes=NODES, spec=spec, constraint_source=constraint_source())
    other = VariantSpec(sharing=0.8, constrained=0.3, seed=8)
    assert first != make_variant(BASE, nodes=NODES, spec=other, constraint_source=constraint_source())


def test_out_of_range_axes_and_missing_sources_are_refused_naming_the_axis() -> None:
    with pytest.raises(VariantError, match=r"multi_gpu = 0\.9"):
        VariantSpec(multi_gpu=0.9)
    with pytest.raises(VariantError, match="gpuspec20"):
        make_variant(BASE, nodes=[node("n", gpus=8)], spec=VariantSpec(constrained=0.2))


def test_the_verb_writes_a_trace_that_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "variant.csv"
    code = fgpuctl(
        ["trace-variant", "--nodes", str(NODES_CSV), "--pods", str(Path(NODES_CSV).parent / "pods.csv"),
         "--out", str(out), "--sharing", "80", "--cpu-only", "200", "--seed", "5"]
    )
    assert code == 0, capsys.readouterr().err
    variant = read_pods(out)
    assert stats(variant).cpu_only_pods == 6
    assert stats(variant).sharing == pytest.approx(0.8, abs=0.1)
    assert "variant:" in capsys.readouterr().out


def test_the_verb_refuses_to_write_into_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    inside = Path(__file__).resolve().parent / "variant.csv"
    code = fgpuctl(["trace-variant", "--nodes", str(NODES_CSV), "--pods", str(NODES_CSV.parent / "pods.csv"), "--out", str(inside)])
    assert code == 2
    assert "inside the repository" in capsys.readouterr().err
    assert not inside.exists()


def test_the_verb_refuses_an_out_of_range_percent_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(
        ["trace-variant", "--nodes", str(NODES_CSV), "--pods", str(NODES_CSV.parent / "pods.csv"),
         "--out", str(tmp_path / "v.csv"), "--multi-gpu", "90"]
    )
    assert code == 2
    assert "--multi-gpu 90 is out of range; give a percent in 0..60" in capsys.readouterr().err
    assert not (tmp_path / "v.csv").exists()


def test_a_variant_of_a_variant_keeps_every_name_unique() -> None:
    first = make_variant(base_sample(), nodes=NODES, spec=VariantSpec(seed=1, cpu_only=2.0, sharing=0.6))
    second = make_variant(first, nodes=NODES, spec=VariantSpec(seed=2, cpu_only=1.5, sharing=0.9))
    assert any(p.name.startswith("variant-cpu-") for p in first)
    assert any(p.name.startswith("variant-gpu-") for p in first)
    for pods in (first, second):
        names = [p.name for p in pods]
        assert len(names) == len(set(names))
