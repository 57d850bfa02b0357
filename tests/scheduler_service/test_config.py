from __future__ import annotations

from pathlib import Path

import pytest

from apis.allocation import Allocation, GPUShare
from scheduler_plugin import main as cli
from scheduler_plugin.app import default_core_factory
from scheduler_plugin.config import (
    ConfigError,
    SchedulerConfig,
    StateBackend,
    check_policies,
    from_mapping,
    load_file,
    with_overrides,
)
from scheduler_plugin.core import policies
from scheduler_plugin.core.api import Core, NodeName
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, info, node, pod, share


def test_a_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("state: embedded\ndb: /tmp/x.db\npolicy: spread\nleaderElection:\n  leaseDurationSeconds: 30\n")

    config = with_overrides(load_file(str(path)), policy="binpack", db=None)

    assert (config.state, config.db, config.policy) == (StateBackend.EMBEDDED, "/tmp/x.db", "binpack")
    assert config.leader_election.lease_duration_s == 30.0


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"polcy": "binpack"}, "unknown key 'polcy'; valid keys are"),
        ({"state": "etcd"}, "state='etcd': unknown state backend; use one of kubernetes, embedded"),
        ({"standalone": "yes"}, "standalone='yes': expected true or false"),
        ({"assumeTTLSeconds": 0}, "assumeTTLSeconds=0: must be more than zero; write e.g. 60"),
        ({"leaderElection": {"renewDeadlineSeconds": 20}}, "renewDeadlineSeconds < leaseDurationSeconds"),
        ({"state": "embedded", "standalone": True}, "use --state kubernetes, or drop --standalone"),
    ],
)
def test_bad_config_is_refused_naming_key_value_and_fix(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(data)

    assert needle in str(caught.value)


def test_the_command_line_refuses_an_unknown_policy_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--policy", "best-ever", "--state", "embedded", "--db", "/tmp/unused.db"])

    err = capsys.readouterr().err
    assert code == 2
    assert "policy (--policy)='best-ever': unknown policy; choose one of" in err and "binpack" in err


def test_the_command_line_reports_a_missing_signing_key_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--state", "embedded", "--db", str(tmp_path / "s.db"), "--grpc-listen", "", "--signing-key", str(tmp_path / "nokey")])

    assert code == 1
    assert "signing key file" in capsys.readouterr().err


def _choice(core: Core) -> str | None:
    """Node a holds 60% of a GPU and little CPU, node b no GPU share but half its CPU: GPU vs CPU weights decide."""
    for name in ("a", "b"):
        core.upsert_node_devices(node(name, 2))
        core.upsert_node_info(info(name, cpu=10000, memory_gib=100))
    held = GPUShare(0, "GPU-a-0", 60, 48 * GiB, 60)
    core.add_pod(pod("held-a"), NodeName("a"), Allocation(gpus=(held,)))
    core.add_pod(pod("cpu-b", cpu=5000), NodeName("b"), None)
    return core.select(pod("p", share(20, gib=10), cpu=1000))


def test_policy_params_from_the_file_reach_the_cores_scoring(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "policy: binpack\n"
        "policyParams: {weight_gpu_core: 0, weight_gpu_memory: 0, weight_cpu: 1, weight_memory: 0}\n"
    )
    config = load_file(str(path))
    check_policies(config)

    assert _choice(default_core_factory(SchedulerConfig())()) == "a"  # GPU weights count by default
    assert _choice(default_core_factory(config)()) == "b"  # CPU alone counts now


def test_gpu_policy_params_tune_a_gpu_level_policy_of_its_own() -> None:
    config = from_mapping({"policy": "binpack", "gpuPolicyParams": {"weight_cpu": 0}})
    check_policies(config)

    core = default_core_factory(config)()

    assert core.gpu_policy is not core.node_policy  # type: ignore[attr-defined]
    assert dict(core.gpu_policy.context.params) == {"weight_cpu": 0.0}  # type: ignore[attr-defined]
    assert dict(core.node_policy.context.params) == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"policyParams": [1, 2]}, "policyParams=[1, 2]: expected a mapping of parameter name to number"),
        ({"policyParams": {"weight_cpu": "high"}}, "policyParams.weight_cpu='high': expected a finite number"),
        ({"gpuPolicyParams": {"weight_cpu": True}}, "gpuPolicyParams.weight_cpu=True: expected a finite number"),
    ],
)
def test_policy_params_that_are_not_numbers_are_refused_naming_key_and_value(
    data: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(data)

    assert needle in str(caught.value)


def test_the_default_policy_is_fgpu() -> None:
    assert from_mapping({}).policy == "fgpu"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {"policy": "binpack", "policyParams": {"weight_gpu": 1}},
            "policyParams: weight_gpu is not a parameter of policy 'binpack'; it takes weight_gpu_core, ",
        ),
        ({"policy": "fgd", "policyParams": {"weight_cpu": 1}}, "policy 'fgd'; it takes none; remove the key"),
        (
            {"policy": "binpack", "gpuPolicy": "fgpu", "gpuPolicyParams": {"weight_cpu": 1}},
            "gpuPolicyParams: weight_cpu is not a parameter of policy 'fgpu'; it takes strand_weight",
        ),
        (
            {"policy": "spread", "policyParams": {"weight_cpu": -1}},
            "policyParams={'weight_cpu': -1.0}: policy 'spread': weight_cpu=-1.0 must be a number >= 0",
        ),
        (
            {"policy": "binpack", "policyParams": {"weight_gpu_core": 0, "weight_gpu_memory": 0, "weight_cpu": 0, "weight_memory": 0}},
            "all weights are 0; give at least one resource a weight > 0",
        ),
    ],
)
def test_policy_params_the_chosen_policy_does_not_take_are_refused_with_the_ones_it_does(
    data: dict[str, object], needle: str
) -> None:
    config = from_mapping(data)

    with pytest.raises(ConfigError) as caught:
        check_policies(config)

    assert needle in str(caught.value)


def test_the_command_line_checks_policy_params_against_the_policy_a_flag_chose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("policy: binpack\npolicyParams: {weight_cpu: 0}\n")

    code = cli.main(["--config", str(path), "--policy", "fgpu", "--state", "embedded", "--db", "/tmp/unused.db"])

    assert code == 2
    assert "policyParams: weight_cpu is not a parameter of policy 'fgpu'" in capsys.readouterr().err


def test_the_config_and_the_core_default_to_the_one_default_policy() -> None:
    assert from_mapping({}).policy == policies.DEFAULT_POLICY
    assert default_core_factory(SchedulerConfig())().node_policy.name == policies.DEFAULT_POLICY  # type: ignore[attr-defined]
    assert Scheduler().node_policy.name == policies.DEFAULT_POLICY


def test_a_plug_in_policy_and_its_declared_parameter_are_accepted_from_its_module_alone() -> None:
    policies.discover("tests.scheduler_core.plugin_policies")  # what a new policy_*.py module gets from the core
    config = from_mapping({"policy": "firstfit", "policyParams": {"level": 70}})

    check_policies(config)

    core = default_core_factory(config)()
    assert core.node_policy.name == "firstfit"  # type: ignore[attr-defined]
    assert core.node_policy.level == 70  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (
            {"level": 150},
            "policyParams={'level': 150.0}: policy 'firstfit': level=150.0 must be a whole number >= 0 and <= 100; "
            "leave it out for the default, level: 50",
        ),
        ({"level": 50.5}, "policy 'firstfit': level=50.5 must be a whole number; leave it out for the default"),
        ({"levle": 5}, "policyParams: levle is not a parameter of policy 'firstfit'; it takes level"),
    ],
)
def test_a_plug_in_policys_parameters_are_checked_by_their_declaration(params: dict[str, object], needle: str) -> None:
    policies.discover("tests.scheduler_core.plugin_policies")
    config = from_mapping({"policy": "firstfit", "policyParams": params})

    with pytest.raises(ConfigError) as caught:
        check_policies(config)

    assert needle in str(caught.value)
