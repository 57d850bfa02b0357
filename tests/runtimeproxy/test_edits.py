"""Reading a hook's answer into edits, and merging them into what a request already holds."""

from __future__ import annotations

import pytest

from apis import container_edits
from apis.container_edits import CgroupResources, ContainerEdits, DeviceNode, EditsError, Mount, Propagation
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy import edits as edit_rules
from runtimeproxy.edits import merge_annotations, merge_by_key, merge_env, merge_names


@pytest.mark.parametrize(
    ("current", "set_envs", "unset", "expected"),
    [
        pytest.param([("A", "1"), ("B", "2")], [("B", "x")], [], [("A", "1"), ("B", "x")], id="replaces in place"),
        pytest.param([("A", "1")], [("C", "3")], [], [("A", "1"), ("C", "3")], id="appends new"),
        pytest.param([("A", "1"), ("B", "2")], [], ["A"], [("B", "2")], id="unsets"),
        pytest.param([("A", "1")], [("A", "2")], ["A"], [("A", "2")], id="set wins over unset of the same name"),
        pytest.param([("A", "1"), ("B", "2"), ("A", "3")], [("A", "x")], [], [("A", "x"), ("B", "2")],
                     id="duplicate names collapse onto the first"),
        pytest.param([("A", "1"), ("A", "3")], [], [], [("A", "1"), ("A", "3")], id="untouched duplicates stay"),
        pytest.param([], [("A", "1"), ("A", "2")], [], [("A", "2")], id="last of repeated sets wins"),
    ],
)
def test_env_merge_keeps_everything_it_was_not_asked_to_change(
    current: list[tuple[str, str]], set_envs: list[tuple[str, str]], unset: list[str], expected: list[tuple[str, str]]
) -> None:
    assert merge_env(current, set_envs=set_envs, unset=set(unset)) == expected


def test_mounts_with_the_same_container_path_are_replaced_not_duplicated() -> None:
    current = [("/a", "host-a"), ("/b", "host-b")]
    added = [("/b", "new-b"), ("/c", "host-c")]
    merged = merge_by_key(current, added, key=lambda m: m[0])
    assert merged == [("/a", "host-a"), ("/b", "new-b"), ("/c", "host-c")]


def test_cdi_names_are_deduplicated_in_order() -> None:
    assert merge_names(["nvidia.com/gpu=0"], ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1",
    ]


def test_annotations_are_removed_then_set() -> None:
    got = merge_annotations({"a": "1", "b": "2"}, set_annotations=[("c", "3"), ("a", "9")], remove={"b", "a"})
    assert got == {"a": "9", "c": "3"}


def test_edit_counts_name_each_kind() -> None:
    edits = ContainerEdits(envs=(("A", "1"),), unset_envs=("B",), resources=CgroupResources(cpu_shares=2))
    assert edit_rules.counts(edits) == {"env": 2, "mount": 0, "device": 0, "cdi": 0, "annotation": 0, "resources": 1}
    assert edit_rules.counts(ContainerEdits())["resources"] == 0


def test_an_answer_read_back_is_the_edits_the_hook_sent() -> None:
    sent = ContainerEdits(
        envs=(("A", "1"),),
        unset_envs=("B",),
        mounts=(Mount("/c", "/h", readonly=False, selinux_relabel=True, propagation=Propagation.BIDIRECTIONAL),),
        devices=(DeviceNode("/dev/x", "/dev/y", "r"),),
        cdi_devices=("vendor.com/dev=1",),
        set_annotations=(("a", "1"), ("b", "2")),
        remove_annotations=("old",),
        resources=CgroupResources(cpu_quota=0, cpuset_mems="0", unified={"dmem.max": "1"}),
    )
    wire = container_edits.to_proto(sent).SerializeToString()
    assert container_edits.from_proto(hooks_pb2.HookResponse.FromString(wire)) == sent
    # cpu_quota=0 is said, not dropped: the proxy sets it; the unset fields keep the request's.
    assert hooks_pb2.HookResponse.FromString(wire).resources.HasField("cpu_quota")
    assert container_edits.from_proto(hooks_pb2.HookResponse()) == ContainerEdits()


def test_a_device_without_permissions_gets_the_cri_default() -> None:
    answer = hooks_pb2.HookResponse(add_devices=[hooks_pb2.Device(container_path="/dev/x", host_path="/dev/x")])
    assert container_edits.from_proto(answer).devices == (DeviceNode("/dev/x", "/dev/x", "rw"),)


def test_a_mount_propagation_the_protocol_lacks_is_refused_naming_the_field() -> None:
    mount = hooks_pb2.Mount(container_path="/c", host_path="/h", propagation=7)  # type: ignore[arg-type]
    answer = hooks_pb2.HookResponse(add_mounts=[hooks_pb2.Mount(container_path="/ok", host_path="/ok"), mount])
    with pytest.raises(EditsError, match=r"add_mounts\[1\]\.propagation=7 is not a MountPropagation"):
        container_edits.from_proto(answer)
