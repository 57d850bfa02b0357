"""Process-to-pod mapping from sample /proc/<pid>/cgroup files of both cgroup versions."""

from __future__ import annotations

import os

import pytest

from agent.cgroups import NO_OWNER, CgroupOwner, PidResolver, parse_cgroup_file
from tests.agent.helpers import read_data


@pytest.mark.parametrize(
    ("sample", "owner"),
    [
        (
            "v1-cgroupfs",
            CgroupOwner("0c2f9d4e-1b7a-4c3e-9f00-3d6b8e2a7c11", "8d5a1f0e3b2c4d6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"),
        ),
        (
            "v1-systemd",
            CgroupOwner("5e1d7a3b-2c4f-4a8e-b6d1-9f0e3c2b1a47", "4f3e2d1c0b9a8f7e6d5c4b3a29181716f5e4d3c2b1a0f9e8d7c6b5a493827160"),
        ),
        (
            "v2-systemd",
            CgroupOwner("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
        ),
        (
            "v2-cgroupfs",
            CgroupOwner("1f2e3d4c-5b6a-4978-8a6b-5c4d3e2f1a0b", "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"),
        ),
        (
            "v2-crio-guaranteed",
            CgroupOwner("2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091", "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899"),
        ),
        ("v2-pod-sandbox-only", CgroupOwner("7c6b5a49-3827-4160-9f8e-7d6c5b4a3928", "")),
        (
            "v2-nested-namespace",
            CgroupOwner("3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b", "1" * 64),
        ),
        ("host-process", NO_OWNER),
    ],
)
def test_a_cgroup_file_maps_to_its_pod_and_container(sample: str, owner: CgroupOwner) -> None:
    assert parse_cgroup_file(read_data("cgroup", sample)) == owner


def test_an_empty_or_garbled_file_maps_to_no_pod() -> None:
    assert parse_cgroup_file("") == NO_OWNER
    assert parse_cgroup_file("not a cgroup file\n\n:::") == NO_OWNER


def _proc(root: str, pid: int, content: str) -> None:
    os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
    with open(os.path.join(root, str(pid), "cgroup"), "w") as f:
        f.write(content)


def test_the_resolver_reads_each_process_once_while_it_lives(tmp_path: object) -> None:
    root = str(tmp_path)
    _proc(root, 10, read_data("cgroup", "v2-systemd"))
    resolver = PidResolver(proc_root=root)
    first = resolver.resolve(10)
    _proc(root, 10, read_data("cgroup", "host-process"))  # would change the answer if re-read
    assert resolver.resolve(10) == first
    assert resolver.reads == 1


def test_a_pid_that_disappears_is_read_afresh_when_it_comes_back(tmp_path: object) -> None:
    root = str(tmp_path)
    _proc(root, 10, read_data("cgroup", "v2-systemd"))
    resolver = PidResolver(proc_root=root)
    resolver.resolve(10)
    resolver.retain([])
    _proc(root, 10, read_data("cgroup", "v1-cgroupfs"))  # pid reused by another pod
    assert resolver.resolve(10).pod_uid == "0c2f9d4e-1b7a-4c3e-9f00-3d6b8e2a7c11"


def test_a_process_without_a_cgroup_file_counts_as_outside_pods(tmp_path: object) -> None:
    assert PidResolver(proc_root=str(tmp_path)).resolve(4242) == NO_OWNER


def test_the_uncached_baseline_reads_every_time(tmp_path: object) -> None:
    root = str(tmp_path)
    _proc(root, 10, read_data("cgroup", "v2-systemd"))
    resolver = PidResolver(proc_root=root, cached=False)
    resolver.resolve(10)
    resolver.resolve(10)
    assert resolver.reads == 2
