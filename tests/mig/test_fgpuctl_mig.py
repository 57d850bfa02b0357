"""`fgpuctl mig enable|disable NODE GPU` against the API double: a drained, explicit request on the Node."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.devices import NodeDevices
from apis.inventory import MIGInstance
from apis.mig import A100_80GB, mode_request_key, mode_requests
from apis.signing import allocation_annotations
from fgpuctl.main import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, pod
from tests.signing_keys import signing_key

KEY = signing_key("mig-test-key")
GPU0 = "GPU-n1-00"


def a100_node(*, mig: bool = False, instances: tuple[MIGInstance, ...] = ()) -> NodeDevices:
    devices = gpu_node("n1", gpus=2, model="NVIDIA A100-SXM4-80GB", label="A100-SXM4-80GB")
    gpus = tuple(
        replace(g, mig_profiles=A100_80GB, mig_enabled=mig, mig_instances=instances if g.index == 0 else ())
        for g in devices.gpus
    )
    return replace(devices, gpus=gpus)


def seed(api: KubeAPIServer, devices: NodeDevices, *, cordoned: bool = True) -> None:
    cluster.install(api)
    cluster.add_node(api, devices)
    if cordoned:
        node = api.get_object("/api/v1/nodes/n1")
        assert node is not None
        node["spec"] = {"unschedulable": True}
        api.put_object("/api/v1/nodes", node)


def hold(api: KubeAPIServer, share: GPUShare, name: str = "train-0") -> None:
    uid = str(uuid.uuid4())
    obj = pod(
        name, uid=uid, node_name="n1", requests={names.GPU_CORE: "30", names.GPU_MEMORY: "20Gi"},
        annotations=allocation_annotations(KEY, pod_uid=uid, node_name="n1", allocation=Allocation(gpus=(share,))),
    )
    obj["status"] = {"phase": "Running"}
    cluster.add_pod(api, obj)


def run(api: KubeAPIServer, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = fgpuctl(["mig", *args, "--kubeconfig", api.kubeconfig_path])
    out, err = capsys.readouterr()
    return code, out, err


def requests_on_node(api: KubeAPIServer) -> dict[str, bool]:
    node: Any = api.get_object("/api/v1/nodes/n1")
    return mode_requests(node["metadata"].get("annotations") or {})


def test_an_idle_gpu_on_a_cordoned_node_gets_the_request(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    seed(kube_api, a100_node())
    hold(kube_api, GPUShare(1, "GPU-n1-01", 30, 20 * 2**30, 25))  # GPU 1 is busy; GPU 0 is not

    code, out, err = run(kube_api, capsys, "enable", "n1", "0")

    assert (code, err) == (0, "")
    assert f"node annotation {mode_request_key(GPU0)}=enabled" in out
    assert requests_on_node(kube_api) == {GPU0: True}


def test_dry_run_writes_nothing(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    seed(kube_api, a100_node())

    code, out, _ = run(kube_api, capsys, "enable", "n1", GPU0, "--dry-run")

    assert code == 0 and out.startswith("dry run, nothing written: requested: GPU 0")
    assert requests_on_node(kube_api) == {}


@pytest.mark.parametrize(
    ("devices", "cordoned", "held", "args", "fragment"),
    [
        (a100_node(), False, None, ("enable", "n1", "0"), "node n1 is not cordoned: a pod could land on GPU 0"),
        (a100_node(), True, GPUShare(0, GPU0, 30, 20 * 2**30, 25), ("enable", "n1", "0"),
         "is held by default/train-0; wait for them to finish or move them (kubectl drain n1)"),
        (a100_node(mig=True), True, GPUShare(0, GPU0, 0, 0, 0, mig_profile="3g.40gb", mig_placement=4),
         ("disable", "n1", "0"), "is held by default/train-0"),
        (a100_node(mig=True, instances=(MIGInstance("MIG-op", "1g.10gb", 10 * 2**30, 1, placement_start=0,
                                                    placement_size=1),)),
         True, None, ("disable", "n1", "0"), "holds MIG instances fgpu did not create (1g.10gb MIG-op)"),
        (replace(a100_node(), gpus=tuple(replace(g, mig_profiles=()) for g in a100_node().gpus)), True, None,
         ("enable", "n1", "0"), "reports no MIG profiles: it does not support MIG"),
        (a100_node(), True, None, ("enable", "n1", "7"), "node 'n1' has no GPU '7'; give an index or UUID: 0 (GPU-n1-00)"),
        (a100_node(), True, None, ("enable", "n9", "0"), "node 'n9' does not exist"),
    ],
    ids=["not cordoned", "a share holds it", "a MIG instance holds it", "an operator's instance", "no MIG support",
         "no such GPU", "no such node"],
)
def test_a_change_that_is_not_drained_is_refused_and_nothing_is_written(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str], devices: NodeDevices, cordoned: bool,
    held: GPUShare | None, args: tuple[str, ...], fragment: str,
) -> None:
    seed(kube_api, devices, cordoned=cordoned)
    if held is not None:
        hold(kube_api, held)

    code, out, err = run(kube_api, capsys, *args)

    assert code == 1 and out == ""
    assert fragment in err, err
    assert requests_on_node(kube_api) == {}


def test_a_gpu_already_in_the_mode_asked_is_left_alone(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    seed(kube_api, a100_node(mig=True))

    code, out, _ = run(kube_api, capsys, "enable", "n1", "0")

    assert code == 0 and "is already in MIG mode; nothing to do" in out
    assert requests_on_node(kube_api) == {}


def test_disabling_a_gpu_with_only_fgpus_idle_instances_is_requested(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = MIGInstance("MIG-mine", "3g.40gb", 40 * 2**30, 3, placement_start=4, placement_size=4, fgpu_created=True)
    seed(kube_api, a100_node(mig=True, instances=(mine,)))

    code, _, err = run(kube_api, capsys, "disable", "n1", "0")

    assert (code, err) == (0, "")
    assert requests_on_node(kube_api) == {GPU0: False}
