"""What a pod may need that standalone mode cannot honour, so it is refused rather than misplaced.

Standalone fgpu-scheduler checks GPUs, CPU, memory, nodeSelector, required node affinity and the
node rules of `noderules.py`. It keeps no view of the pods' labels per topology domain, nor of
volumes, so it cannot honour:

* required pod affinity and anti-affinity (kube-scheduler's InterPodAffinity),
* topology spread constraints with whenUnsatisfiable: DoNotSchedule (PodTopologySpread),
* PersistentVolumeClaims, generic ephemeral volumes included (VolumeBinding, VolumeZone,
  NodeVolumeLimits): a WaitForFirstConsumer claim would never get a volume, a bound one may pin
  the pod to a zone,
* resource claims (DynamicResources).

Preferred (soft) affinity and ScheduleAnyway spreads only rank nodes in kube-scheduler, so ignoring
them places no pod where it must not be; they are not refused. Every constraint listed above is
immutable on a pod, so a refused pod stays refused until it is recreated without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def unsupported(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """What the pod (API dict) needs that standalone mode does not check, one phrase per need."""
    spec = _mapping(pod.get("spec"))
    affinity = _mapping(spec.get("affinity"))
    needs: list[str] = []
    for kind, words in (("podAffinity", "required pod affinity"), ("podAntiAffinity", "required pod anti-affinity")):
        if _list(_mapping(affinity.get(kind)).get(_REQUIRED)):
            needs.append(f"{words} (spec.affinity.{kind}.{_REQUIRED})")
    for i, constraint in enumerate(_list(spec.get("topologySpreadConstraints"))):
        constraint = _mapping(constraint)
        if constraint.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            key = constraint.get("topologyKey") or "?"
            needs.append(f"a topology spread over {key} with whenUnsatisfiable: DoNotSchedule (spec.topologySpreadConstraints[{i}])")
    for i, volume in enumerate(_list(spec.get("volumes"))):
        volume = _mapping(volume)
        name = volume.get("name") or "?"
        claim = _mapping(volume.get("persistentVolumeClaim"))
        if claim:
            needs.append(
                f"volume {name} from PersistentVolumeClaim {claim.get('claimName') or '?'} "
                f"(spec.volumes[{i}].persistentVolumeClaim)"
            )
        elif volume.get("ephemeral"):
            needs.append(f"volume {name} from a generic ephemeral volume claim (spec.volumes[{i}].ephemeral)")
    if _list(spec.get("resourceClaims")):
        needs.append("dynamic resource claims (spec.resourceClaims)")
    return tuple(needs)


def refusal_message(needs: Sequence[str]) -> str:
    """The FailedScheduling message for a pod with `needs` (from `unsupported`): what, and the fix."""
    return (
        "fgpu-scheduler runs in standalone mode, which does not check what this pod needs: "
        + "; ".join(needs)
        + ". Schedule it with the kube-scheduler profile (the default deployment, hack/deploy/; "
        "docs/deploy.md), or recreate the pod without these."
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
