"""`fgpuctl defrag-plan --scheduler`: planning on a running scheduler's own state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import GiB, gpu_node, share_pod


@pytest.fixture
def scheduler(tmp_path: Path, key_file: str) -> Iterator[tuple[SchedulerApp, str]]:
    socket = tmp_path / "sched.sock"
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), grpc_listen=f"unix://{socket}", signing_key=key_file
    )
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    yield app, f"unix://{socket}"
    app.stop(1.0)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert fgpuctl(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_plan_frees_a_whole_gpu_with_moves_whose_targets_have_room(
    scheduler: tuple[SchedulerApp, str], capsys: pytest.CaptureFixture[str]
) -> None:
    app, address = scheduler
    assert app.service is not None
    for name in ("n1", "n2", "n3"):
        app.service.report_devices(gpu_node(name, gpus=1))
    # n1 holds little core but most of the memory: nothing else fits beside it.
    app.service.bind(share_pod("heavy", core=10, memory="75Gi"), "n1")
    app.service.bind(share_pod("a", core=30, memory="8Gi"), "n2")
    app.service.bind(share_pod("b", core=30, memory="8Gi"), "n3")
    state = run_json(capsys, "inspect", "-o", "json", "--scheduler", address)

    plan = run_json(capsys, "defrag-plan", "--scheduler", address, "--gpus", "1", "--max-moves", "2", "--json")

    assert plan["before"]["free_whole_gpus"] == 0 and plan["before"]["pending_fit"] == 0
    assert plan["after"]["free_whole_gpus"] == 1 and plan["after"]["pending_fit"] == 1
    assert len(plan["moves"]) == 1
    gpus = {n["name"]: n["gpus"][0] for n in state["nodes"]}
    held = {p["name"]: p for g in gpus.values() for p in g["pods"]}
    for move in plan["moves"]:
        pod = held[move["pod"].split("/")[1]]
        target = gpus[move["to"]]
        assert move["to"] != "n1", "n1 has no GPU memory left for another pod"
        assert target["core"]["allocated"] + pod["corePercent"] <= 100
        assert target["memory"]["allocatedBytes"] + pod["memoryBytes"] <= 80 * GiB
    assert any("no PodDisruptionBudgets with --scheduler" in note for note in plan["notes"])


def test_the_text_plan_says_that_budgets_are_not_known_from_a_scheduler(
    scheduler: tuple[SchedulerApp, str], capsys: pytest.CaptureFixture[str]
) -> None:
    app, address = scheduler
    assert app.service is not None
    app.service.report_devices(gpu_node("n1", gpus=2))

    assert fgpuctl(["defrag-plan", "--scheduler", address, "--gpus", "2"]) == 0

    out = capsys.readouterr().out
    assert "note: no PodDisruptionBudgets with --scheduler" in out
    assert "pending pods fit" in out and "no move helps" in out


def test_an_unreachable_scheduler_is_one_line_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(["defrag-plan", "--scheduler", f"unix://{tmp_path}/none.sock"])

    err = capsys.readouterr().err
    assert code == 1  # the cluster could not be read, as inspect and top exit; 2 is for wrong flags
    assert err.startswith("fgpuctl defrag-plan: --scheduler=unix://") and "UNAVAILABLE" in err
    assert len(err.strip().splitlines()) == 1


def test_two_cluster_sources_at_once_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(["defrag-plan", "--scheduler", "unix:///x.sock", "--snapshot", str(tmp_path / "s.json")])

    assert code == 2
    assert "--snapshot and --scheduler: give one cluster source" in capsys.readouterr().err
