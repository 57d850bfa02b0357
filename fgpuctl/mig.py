"""`fgpuctl mig enable|disable NODE GPU`: ask a node to switch one GPU into or out of MIG mode, drained.

A mode change needs an idle GPU and a reset, so it is never implicit. This verb
checks, from the same sources as `fgpuctl inspect --kubeconfig` (Devices and
pod allocations, rebuilt by the scheduler's own loading code) plus the Node:

- the node is cordoned (`kubectl cordon NODE`): otherwise the scheduler could
  place a pod on the GPU between this check and the switch;
- no pod holds the GPU, a share of it or a MIG instance on it;
- the GPU reports MIG profiles (it supports MIG) and is not in the mode asked;
- to disable: no MIG instance an operator made is on it (fgpu never touches
  those; its own idle instances are destroyed by the agent first).

Then it records the request as a Node annotation, `fgpu.io/mig-mode.<GPU
UUID>: enabled|disabled` (`apis.mig.mode_request_key`), and removes the agent's
answer to an earlier request of that GPU. The node's agent (agent/mig_mode_switch.py)
checks again on its next pass, switches the GPU once it is idle (no allocation,
no process, the node still cordoned), answers in `fgpu.io/mig-mode-status.<GPU
UUID>` (`apis.mig_mode`) with an Event on the Node, reports the new mode and
removes the request; the operator uncordons the node after `fgpuctl inspect`
shows it. `kubectl annotate node NODE fgpu.io/mig-mode.<UUID>-` withdraws a
request the agent has not carried out yet.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis import names
from apis.mig import mode_request_key
from apis.mig_mode import status_key
from fgpuctl import api_errors, kubecontext
from fgpuctl.cluster_state import GPURow, NodeRow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["enable", "disable"], help="switch the GPU into (enable) or out of MIG mode")
    parser.add_argument("node", help="the node's name")
    parser.add_argument("gpu", help="the GPU: its index on the node (as fgpuctl inspect shows it) or its UUID")
    parser.add_argument("--kubeconfig", metavar="FILE", default="", help="the cluster (default: in-cluster, then ~/.kube/config)")
    kubecontext.add_flag(parser)
    parser.add_argument("--dry-run", action="store_true", help="check and print the request, write nothing")


@dataclass(frozen=True)
class Decision:
    """What to write on the Node (annotation key and value), or why nothing may be written."""

    message: str
    key: str = ""
    value: str = ""
    #: The GPU the request is for (set with `key`).
    gpu_uuid: str = ""
    #: Refused: the message says why and what to do.
    refused: bool = False

    @property
    def writes(self) -> bool:
        return bool(self.key)


def decide(*, node: str, gpu: str, enable: bool, row: NodeRow | None, node_object: Mapping[str, Any] | None) -> Decision:
    """The verb's whole decision, over what the API holds; no I/O."""
    mode = "enable" if enable else "disable"
    if node_object is None:
        return Decision(f"node {node!r} does not exist", refused=True)
    if row is None or not row.gpus:
        why = row.discovery_error if row is not None and row.discovery_error else "no GPUs in its Device report"
        return Decision(f"node {node!r} has {why}; is fgpu-agent running there?", refused=True)
    found = _find(row.gpus, gpu)
    if found is None:
        listed = ", ".join(f"{g.device.index} ({g.device.uuid})" for g in sorted(row.gpus, key=lambda g: g.device.index))
        return Decision(f"node {node!r} has no GPU {gpu!r}; give an index or UUID: {listed}", refused=True)
    device = found.device
    what = f"GPU {device.index} ({device.uuid}, {found.model}) of node {node}"
    if not device.mig_profiles:
        return Decision(
            f"{what} reports no MIG profiles: it does not support MIG, or its agent predates dynamic MIG", refused=True
        )
    if device.mig_enabled == enable:
        return Decision(f"{what} is already {'in' if enable else 'out of'} MIG mode; nothing to do")
    spec = node_object.get("spec") or {}
    if not (isinstance(spec, Mapping) and spec.get("unschedulable")):
        return Decision(
            f"node {node} is not cordoned: a pod could land on GPU {device.index} before the agent switches it; "
            f"run `kubectl cordon {node}` first, and `kubectl uncordon {node}` once fgpuctl inspect shows the new mode",
            refused=True,
        )
    if found.held_externally:
        return Decision(
            f"{what} is held outside fgpu (a pod asking nvidia.com/gpu or another device plugin's resource); "
            f"wait for it to finish or move it (kubectl drain {node}), then run fgpuctl mig {mode} again",
            refused=True,
        )
    if found.pods:
        holders = ", ".join(f"{p.namespace}/{p.name}" for p in sorted(found.pods, key=lambda p: (p.namespace, p.name)))
        return Decision(
            f"{what} is held by {holders}; wait for them to finish or move them (kubectl drain {node}), then run "
            f"fgpuctl mig {mode} again",
            refused=True,
        )
    if not enable:
        theirs = [m for m in device.mig_instances if not m.fgpu_created]
        if theirs:
            listed = ", ".join(f"{m.profile} {m.uuid}" for m in theirs)
            return Decision(
                f"{what} holds MIG instances fgpu did not create ({listed}); fgpu never destroys an operator's "
                "instances: destroy them (nvidia-smi mig -dci, -dgi) first",
                refused=True,
            )
    value = names.MIG_MODE_ENABLED if enable else names.MIG_MODE_DISABLED
    return Decision(
        f"requested: {what} -> MIG mode {value}. The agent switches it once the GPU is idle (a GPU reset); "
        f"fgpuctl inspect {node} shows the result; then kubectl uncordon {node}",
        key=mode_request_key(device.uuid),
        value=value,
        gpu_uuid=device.uuid,
    )


def _find(gpus: tuple[GPURow, ...], ref: str) -> GPURow | None:
    for g in gpus:
        if ref == g.device.uuid or (ref.isdigit() and int(ref) == g.device.index):
            return g
    return None


def run(args: argparse.Namespace) -> int:
    from fgpuctl.cluster_state import read_api
    from scheduler_plugin.kube import Kube

    try:
        state = read_api(args.kubeconfig, [args.node])
        kube = Kube.connect(kubeconfig=args.kubeconfig)
        try:
            node_object = kube.get_node(args.node)
            row = next((r for r in state.rows if r.name == args.node), None)
            decision = decide(node=args.node, gpu=args.gpu, enable=args.action == "enable", row=row, node_object=node_object)
            if decision.writes and not args.dry_run:
                # The agent's answer to an earlier request of this GPU goes: the next one answers this one.
                kube.patch_node_metadata(
                    args.node, annotations={decision.key: decision.value, status_key(decision.gpu_uuid): None}
                )
        finally:
            kube.close()
    except Exception as exc:  # reported to the operator as one line, not a traceback
        print(f"fgpuctl mig: {api_errors.explain(exc)}", file=sys.stderr)
        return 1
    if decision.refused:
        print(f"fgpuctl mig {args.action}: refused: {decision.message}", file=sys.stderr)
        return 1
    prefix = "dry run, nothing written: " if args.dry_run and decision.writes else ""
    print(f"{prefix}{decision.message}")
    if decision.writes:
        print(f"  node annotation {decision.key}={decision.value}")
    return 0
