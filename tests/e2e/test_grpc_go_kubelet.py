"""kubelet is a grpc-go client: the safety rules hold when the CRI calls come from grpc-go.

Every other end-to-end test drives the proxy with grpcio (grpc-core). kubelet's own stack is grpc-go,
whose HTTP/2 differs (its SETTINGS, BDP pings and window updates, what it indexes in HPACK). Here the
real `grpcurl` (grpc-go) sends CreateContainer through the proxy to real containerd, with fgpu-agent
as the hook; each container then runs and its own environment is read back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format

from apis import names
from apis.allocation import decode_allocation
from hack.localup import cri, podrun, report
from tests.e2e.conftest import CUDA_LIKE, Node, container, isolation_vars, pod

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

GRPCURL = Path(sys.executable).parent / "grpcurl"
CREATE = "runtime.v1.RuntimeService/CreateContainer"


@pytest.fixture(scope="module")
def protoset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CRI messages kubelet sends, and the one method grpcurl calls, as a FileDescriptorSet."""
    messages = cri._file()
    service_file = descriptor_pb2.FileDescriptorProto(
        name="fgpu/localup/cri_service.proto", package="runtime.v1", dependency=[messages.name], syntax="proto3"
    )
    service_file.service.add(name="RuntimeService").method.add(
        name="CreateContainer",
        input_type=f".{cri.PACKAGE}.CreateContainerRequest",
        output_type=f".{cri.PACKAGE}.CreateContainerResponse",
    )
    path = tmp_path_factory.mktemp("protoset") / "cri.protoset"
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[messages, service_file]).SerializeToString())
    return path


def go_create(node: Node, pod_run: podrun.PodRun, spec: Mapping[str, Any], protoset: Path, *,
              sandbox_annotations: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """CreateContainer for `spec` in the pod's sandbox, sent by grpcurl as kubelet would build it."""
    request = cri.M["CreateContainerRequest"](
        pod_sandbox_id=pod_run.sandbox_id,
        config=podrun.container_config(pod_run.pod, spec, node=pod_run.node),
        sandbox_config=pod_run.sandbox_config,
    )
    if sandbox_annotations is not None:
        request.sandbox_config.annotations.clear()
        request.sandbox_config.annotations.update(sandbox_annotations)
    socket = node.stack.proxy_address.removeprefix("unix://")
    return subprocess.run(
        [str(GRPCURL), "-plaintext", "-unix", "-protoset", str(protoset), "-d", "@", socket, CREATE],
        input=json_format.MessageToJson(request), capture_output=True, text=True, timeout=60,
    )


def run_created(node: Node, pod_run: podrun.PodRun, created: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Starts the container grpcurl created, waits for it, and returns the environment it printed."""
    assert created.returncode == 0, created.stdout + created.stderr
    container_id = str(json_format.Parse(created.stdout, cri.M["CreateContainerResponse"]()).container_id)
    pod_run.created.append(container_id)  # removed with the pod
    node.kubelet.start_container(container_id)
    result = node.kubelet.wait_exited(container_id)
    assert result.exited and result.exit_code == 0, node.logs()
    with open(result.log_path, errors="replace") as f:
        return report.env_from_lines(report.parse_cri_log(f.read()))


def test_a_grpc_go_kubelet_gets_the_gpu_for_the_asking_container_and_void_for_its_sidecar(
    hami: Node, protoset: Path
) -> None:
    main, sidecar = container("main", core=50, ratio=50), container("sidecar", image=CUDA_LIKE)
    pod_run = hami.start(hami.schedule(pod("go-kubelet", [main, sidecar])))
    (share,) = decode_allocation(pod_run.annotations[names.DEVICE_ALLOCATED]).gpus

    gpu_env = run_created(hami, pod_run, go_create(hami, pod_run, main, protoset))
    assert gpu_env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, gpu_env
    assert gpu_env[names.FGPU_CORE_PERCENT] == "50", gpu_env

    side_env = run_created(hami, pod_run, go_create(hami, pod_run, sidecar, protoset))
    assert side_env[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID, side_env
    assert isolation_vars(side_env) == {}, side_env


def test_a_grpc_go_kubelet_sending_an_edited_allocation_is_refused_and_nothing_is_created(
    hami: Node, protoset: Path
) -> None:
    main = container("main", core=30, ratio=30)
    pod_run = hami.start(hami.schedule(pod("go-kubelet-edited", [main])))
    edited = dict(pod_run.annotations)
    edited[names.DEVICE_ALLOCATED] = edited[names.DEVICE_ALLOCATED].replace('"30"', '"100"')
    assert edited != pod_run.annotations

    refused = go_create(hami, pod_run, main, protoset, sandbox_annotations=edited)
    assert refused.returncode != 0, refused.stdout
    assert "FailedPrecondition" in refused.stderr and "signature" in refused.stderr, refused.stderr
    # Nothing was created: the same name and attempt, sent as signed, is not "reserved" at containerd.
    env = run_created(hami, pod_run, go_create(hami, pod_run, main, protoset))
    assert env[names.FGPU_CORE_PERCENT] == "30", env
