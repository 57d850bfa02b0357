"""Everything the soak knows about fgpu's in-flux internals, in one place.

The soak drives the daemons through their command lines and public wire
contracts only (CRI, the Kubernetes API, Prometheus metrics, container env).
What it must still know about them — flag spellings, config-file keys,
annotation and env names, metric names, the allocation JSON, how a scheduler
names itself in the Lease — is here, so a change elsewhere is adapted in this
one file.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from apis import names
from apis.allocation import AllocationError, decode_allocation

SCHEDULER_NAME = names.SCHEDULER_NAME
DEVICE_ALLOCATED = names.DEVICE_ALLOCATED
ALLOCATION_SIGNATURE = names.ALLOCATION_SIGNATURE
ALLOCATION_NODE = names.ALLOCATION_NODE
GPU_CORE = names.GPU_CORE
GPU_MEMORY_RATIO = names.GPU_MEMORY_RATIO
NVIDIA_GPU = names.NVIDIA_GPU
LEASE_NAMESPACE = "kube-system"
LEASE_NAME = names.LEADER_LEASE_NAME

# --- what a container's own env says ---------------------------------------------------
VISIBLE = names.NVIDIA_VISIBLE_DEVICES
VOID = names.NVIDIA_VISIBLE_DEVICES_VOID
ENV_UUIDS = names.FGPU_GPU_UUIDS
ENV_CORE = names.FGPU_CORE_PERCENT
ENV_MEMORY = names.FGPU_MEMORY_BYTES
HAMI_MEMORY_PREFIX = names.HAMI_MEMORY_LIMIT_PREFIX
HAMI_SM_LIMIT = names.HAMI_SM_LIMIT
#: what a container without a GPU must not carry (fgpu's variables and any backend limit)
ISOLATION_PREFIXES = ("FGPU_", "CUDA_DEVICE_", "CUDA_MPS_")

# --- metrics ------------------------------------------------------------------------------
AGENT_ADMITTED = "fgpu_agent_admitted_pods"
SCHED_LEADER = "fgpu_scheduler_is_leader"
SCHED_CORE_ALLOCATED = "fgpu_scheduler_gpu_core_allocated_percent"

HOOK_REGISTRATION = os.path.join("hack", "systemd", "10-fgpu-agent-hook.yaml")
DEVICE_CRD = os.path.join("hack", "deploy", "crds", "device.yaml")


def command(name: str) -> str:
    """A console script beside this Python (the venv's bin)."""
    return os.path.join(os.path.dirname(sys.executable), name)


@dataclass(frozen=True)
class Keys:
    signing_key: str
    verifying_dir: str


def generate_keys(directory: str) -> Keys:
    """`fgpuctl keys generate`, as an operator installs the cluster: private key for the schedulers,
    the public one in a directory for the agents (the ConfigMap volume)."""
    out = os.path.join(directory, "keys")
    subprocess.run([command("fgpuctl"), "keys", "generate", "--out", out], check=True, capture_output=True)
    private = glob.glob(os.path.join(out, "*.key"))[0]
    verifying = os.path.join(directory, "verifying-keys")
    os.makedirs(verifying, exist_ok=True)
    for pub in glob.glob(os.path.join(out, "*.pub")):
        os.link(pub, os.path.join(verifying, os.path.basename(pub)))
    return Keys(signing_key=private, verifying_dir=verifying)


# --- daemon command lines -----------------------------------------------------------------

def scheduler_config(
    *, path: str, kubeconfig: str, grpc_sock: str, metrics: str, signing_key: str, lease_s: float
) -> list[str]:
    """Writes the scheduler's config file; returns its argv (standalone, Lease election, API state)."""
    config = {
        "state": "kubernetes",
        "kubeconfig": kubeconfig,
        "grpcListen": f"unix://{grpc_sock}",
        "metricsListen": metrics,
        "standalone": True,
        "signingKey": signing_key,
        "policy": "binpack",
        "assumeTTLSeconds": 30,
        "leaderElection": {
            "enabled": True,
            "namespace": LEASE_NAMESPACE,
            "leaseName": LEASE_NAME,
            "leaseDurationSeconds": lease_s,
            "renewDeadlineSeconds": round(lease_s * 0.6, 2),
            "retryPeriodSeconds": round(lease_s * 0.1, 2),
        },
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return [command("fgpu-scheduler"), "--config", path, "--log-level", "INFO"]


def agent_argv(
    *, node: str, root: str, kubeconfig: str, inventory: str, hook_sock: str, verifying_dir: str,
    metrics: str, isolation: str, overcommit: str = "",
) -> list[str]:
    """Writes the agent's config file under `root` (HAMi paths there, nothing in /usr); returns its argv.

    `overcommit`: the node pool's overcommit settings file (docs/overcommit.md); "" = none."""
    vgpu = os.path.join(root, "vgpu")
    os.makedirs(vgpu, exist_ok=True)
    for name in ("libvgpu.so", "ld.so.preload"):
        open(os.path.join(vgpu, name), "a").close()
    config = {
        "isolationPaths": {
            "hamiLibrary": os.path.join(vgpu, "libvgpu.so"),
            "hamiPreload": os.path.join(vgpu, "ld.so.preload"),
            "hamiCacheRoot": hami_cache_root(root),
            "hamiLockDir": os.path.join(root, "vgpulock"),
            "mpsPipeDir": os.path.join(root, "mps"),
        },
        "checkpointPath": os.path.join(root, "kubelet_internal_checkpoint"),
        # Shortened (deployed: 60s / 2m) so a missed PostStopPodSandbox is swept within the drain phase.
        "admissionSweep": "5s",
        "admissionSweepGrace": "10s",
        # Shortened (deployed: 5m): a lost GPU stays unhealthy this long after the agent that restarts on the
        # healed inventory starts (its failure is recorded across restarts), well inside the recovery phase.
        "healthQuietPeriod": "5s",
    }
    if overcommit:
        config["overcommit"] = overcommit
    path = os.path.join(root, "agent.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return [
        command("fgpu-agent"), "--config", path, "--kubeconfig", kubeconfig, "--node-name", node,
        "--fake-nvml", inventory, "--hook-listen", f"unix://{hook_sock}", "--isolation", isolation,
        "--verifying-keys", verifying_dir, "--metrics-listen", metrics,
    ]


def hami_cache_root(root: str) -> str:
    return os.path.join(root, "hami-cache")


def proxy_argv(*, listen: str, backend: str, hooks_dir: str, admin: str) -> list[str]:
    return [
        command("fgpu-runtime-proxy"), "--listen", f"unix://{listen}", "--backend", backend,
        "--hook-config-dir", hooks_dir, "--admin-listen", f"unix://{admin}", "--metrics-listen", "",
    ]


def write_hook_registration(*, repo: str, hooks_dir: str, agent_sock: str) -> None:
    """The shipped registration with only the endpoint rewritten (as hack/localup/stack.py does)."""
    with open(os.path.join(repo, HOOK_REGISTRATION)) as f:
        registration = yaml.safe_load(f)
    for hook in registration["hooks"]:
        if hook.get("name") == "fgpu-agent":
            hook["endpoint"] = f"unix://{agent_sock}"
    os.makedirs(hooks_dir, exist_ok=True)
    tmp = os.path.join(hooks_dir, "10-fgpu-agent.yaml.tmp")
    with open(tmp, "w") as f:
        yaml.safe_dump(registration, f, sort_keys=False)
    os.replace(tmp, os.path.join(hooks_dir, "10-fgpu-agent.yaml"))


def leader_pid(lease: Mapping[str, Any] | None) -> int:
    """The pid in the Lease holder's identity (`<host>_<pid>_<random>`, scheduler_plugin/app.py); 0 if none."""
    holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
    match = re.match(r"^.*_(\d+)_[0-9a-f]+$", holder)
    return int(match.group(1)) if match else 0


# --- the allocation annotation --------------------------------------------------------------

@dataclass(frozen=True)
class Share:
    uuid: str
    core_percent: int
    memory_bytes: int


def allocation_shares(annotations: Mapping[str, str]) -> tuple[Share, ...] | None:
    """The GPUs the pod's allocation annotation lists; None when it has none or it cannot be read."""
    text = annotations.get(DEVICE_ALLOCATED)
    if not text:
        return None
    try:
        allocation = decode_allocation(text)
    except AllocationError:
        return None
    return tuple(Share(g.mig_uuid or g.uuid, g.core_percent, g.memory_bytes) for g in allocation.gpus)


def forged_allocation(*, uuid: str, minor: int, core: int, memory_bytes: int, container: str) -> str:
    """A hand-written allocation in the wire shape the scheduler writes (unsigned)."""
    gib = memory_bytes // 2**30
    res = {GPU_CORE: str(core), names.GPU_MEMORY: f"{gib}Gi", GPU_MEMORY_RATIO: str(core)}
    entry = {"id": uuid, "minor": minor, "resources": res,
             "extension": {names.ALLOCATION_CONTAINERS: {container: res}}}
    return json.dumps({"gpu": [entry]}, sort_keys=True, separators=(",", ":"))


def edited_allocation(text: str) -> str:
    """The same allocation with every share raised to the whole GPU (an edit of a bound pod)."""
    data = json.loads(text)
    for entry in data.get("gpu", []):
        for res in [entry.get("resources") or {}, *((entry.get("extension") or {}).get(names.ALLOCATION_CONTAINERS) or {}).values()]:
            res[GPU_CORE] = "100"
            res[GPU_MEMORY_RATIO] = "100"
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def verified_shares(
    *, verifying_dir: str, pod_uid: str, node: str, annotations: Mapping[str, str]
) -> tuple[Share, ...] | None:
    """The shares of an allocation whose signature checks out with the cluster's public keys, as the
    node must check it; None when there is none or it does not verify (forged, edited, replayed)."""
    from apis.keyfiles import load_verifying_keys
    from apis.signing import SignatureError, verify_pod_annotations

    try:
        allocation = verify_pod_annotations(
            load_verifying_keys(verifying_dir), pod_uid=pod_uid, node_name=node, annotations=annotations
        )
    except (SignatureError, AllocationError, ValueError):
        return None
    if allocation is None:
        return None
    return tuple(Share(g.mig_uuid or g.uuid, g.core_percent, g.memory_bytes) for g in allocation.gpus)
