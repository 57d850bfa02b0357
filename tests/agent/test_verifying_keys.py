"""The agent's keys: public keys only, re-read while it runs (rotation restarts nothing), v1 only in the upgrade window."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agent.config import AgentConfig, parse_config
from agent.daemon import Agent
from agent.errors import ConfigError
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.main import build_parser, load_settings
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, encode_allocation
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.signing import SigningKey, allocation_annotations
from tests.agent.helpers import T4
from tests.signing_keys import legacy_v1_signature, signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

NODE = "gpu-node-1"
OLD = signing_key("agent-rotation-old")
NEW = signing_key("agent-rotation-new")
LEGACY = b"the-v1-cluster-key"


@dataclass
class Node:
    agent: Agent
    stub: hooks_pb2_grpc.RuntimeHooksStub
    keys_dir: str
    legacy_file: str


@contextlib.contextmanager
def _running(keys_dir: str | None) -> Iterator[Node]:
    """An agent without Kubernetes on a fake T4 node; `keys_dir` None: its verifyingKeys path does not exist yet."""
    tmp = tempfile.mkdtemp(prefix="fgpu-keys-")  # short: a unix socket path must fit in 108 bytes
    keys = keys_dir or os.path.join(tmp, "verifying-keys")
    legacy_file = os.path.join(tmp, "legacy-key")
    with open(legacy_file, "wb") as f:
        f.write(LEGACY + b"\n")
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=False,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=keys,
        legacy_signing_key=legacy_file,
        metrics_listen="",
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    agent = Agent(config, node_name=NODE, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory))
    agent.start()
    channel = grpc.insecure_channel(f"unix://{tmp}/hooks.sock")
    try:
        _wait(lambda: len(agent.state.devices().gpus) == 4)
        yield Node(agent, hooks_pb2_grpc.RuntimeHooksStub(channel), keys, legacy_file)  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        agent.stop(2)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with _running(write_verifying_keys(str(tmp_path / "verifying-keys"), OLD)) as running:
        yield running



def _allocation(node: Node) -> Allocation:
    gpu = node.agent.state.devices().gpus[0]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=10, memory_bytes=2**30, memory_ratio_percent=7,
        containers=(ContainerShare("main", 10, 2**30, 7),),
    )
    return Allocation(gpus=(share,))


def _signed(node: Node, key: SigningKey, uid: str) -> dict[str, str]:
    return allocation_annotations(key, pod_uid=uid, node_name=NODE, allocation=_allocation(node))


def _v1_signed(node: Node, uid: str) -> dict[str, str]:
    annotation = encode_allocation(_allocation(node))
    signature = legacy_v1_signature(LEGACY, pod_uid=uid, node_name=NODE, annotation=annotation)
    return {names.DEVICE_ALLOCATED: annotation, names.ALLOCATION_SIGNATURE: signature, names.ALLOCATION_NODE: NODE}


def _create(node: Node, uid: str, annotations: dict[str, str]) -> str:
    """PreCreateContainer as the proxy sends it; "" when admitted, else the rejection."""
    response = node.stub.PreCreateContainer(
        hooks_pb2.ContainerHookRequest(
            pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid, annotations=annotations),
            container=hooks_pb2.ContainerMeta(name="main"),
        ),
        timeout=5,
    )
    return str(response.rejection.reason)


def test_a_public_key_added_while_the_agent_runs_is_accepted_without_a_restart(node: Node) -> None:
    assert _create(node, "a", _signed(node, OLD, "a")) == ""
    refused = _create(node, "b", _signed(node, NEW, "b"))
    assert f"signed with key {NEW.key_id}, which is not one of the verifying keys here ({OLD.key_id})" in refused

    write_verifying_keys(node.keys_dir, NEW)

    _wait(lambda: _create(node, "b", _signed(node, NEW, "b")) == "")
    # A container of the old pod restarts: its signature by the old key still verifies.
    assert _create(node, "a", _signed(node, OLD, "a")) == ""


def test_a_public_key_dropped_while_the_agent_runs_is_refused_after_it(node: Node) -> None:
    write_verifying_keys(node.keys_dir, NEW)
    _wait(lambda: _create(node, "b", _signed(node, NEW, "b")) == "")

    os.unlink(os.path.join(node.keys_dir, f"{OLD.key_id}.pub"))

    _wait(lambda: f"signed with key {OLD.key_id}" in _create(node, "a", _signed(node, OLD, "a")))
    assert _create(node, "b", _signed(node, NEW, "b")) == ""


def test_a_v1_signed_pod_is_admitted_only_while_the_agent_has_the_legacy_key(node: Node) -> None:
    assert _create(node, "v1-pod", _v1_signed(node, "v1-pod")) == ""

    os.unlink(node.legacy_file)  # the end of the upgrade window: the legacy Secret is deleted

    _wait(lambda: "carries a v1 (HMAC) signature" in _create(node, "v1-pod", _v1_signed(node, "v1-pod")))
    refused = _create(node, "v1-pod", _v1_signed(node, "v1-pod"))
    assert "no legacySigningKey" in refused and "delete the pod" in refused
    assert _create(node, "a", _signed(node, OLD, "a")) == ""


def test_without_its_public_keys_the_agent_refuses_allocations_naming_the_path_then_reads_them_when_they_come() -> None:
    with _running(None) as node:
        refused = _create(node, "a", _signed(node, OLD, "a"))
        assert refused.startswith(f"fgpu agent cannot verify GPU allocations: verifying key file {node.keys_dir} does not exist")
        assert _create(node, "cpu-only", {}) == ""

        write_verifying_keys(node.keys_dir, OLD)

        assert _create(node, "a", _signed(node, OLD, "a")) == ""


def test_the_old_signing_key_setting_is_refused_with_what_replaced_it() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"signingKey": "/etc/fgpu/keys/signing-key"}, source="agent.yaml")

    message = str(refused.value)
    assert message.startswith("agent.yaml: signingKey='/etc/fgpu/keys/signing-key' is no longer read")
    assert "set verifyingKeys" in message and "legacySigningKey" in message


def test_the_key_settings_come_from_the_file_and_the_flags_override_them() -> None:
    config = parse_config({"verifyingKeys": "/etc/fgpu/verifying-keys", "legacySigningKey": "/etc/fgpu/legacy/signing-key"})
    assert (config.verifying_keys, config.legacy_signing_key) == ("/etc/fgpu/verifying-keys", "/etc/fgpu/legacy/signing-key")

    args = build_parser().parse_args(["--verifying-keys", "/k", "--legacy-signing-key", "/old"])
    assert (load_settings(args).verifying_keys, load_settings(args).legacy_signing_key) == ("/k", "/old")
    assert AgentConfig().legacy_signing_key == ""


def test_an_empty_verifying_keys_setting_is_refused() -> None:
    with pytest.raises(ConfigError, match="verifyingKeys is empty; give the file or directory"):
        parse_config({"verifyingKeys": ""})
