"""A Pod (API dict or kubernetes V1Pod) turned into the `PodRequest` the core decides on.

Parsing happens once, in the adapter, so the core never reads a manifest. Bad
input raises `apis.request.RequestError` with one message per problem, each
naming the field, the value and the fix.

The job key groups pods that must share a GPU model: the `fgpu.io/job-key`
annotation, else the pod-group label, else the JobSet name label, else the
pod's owning Job or ReplicaSet (by uid). A JobSet never owns pods itself: it
makes one child Job per replicated job, so its pods are grouped by the
`jobset.sigs.k8s.io/jobset-name` label the JobSet controller puts on each.
Name-based keys are namespaced so equal names in two namespaces never meet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis import names
from apis.mig import MIGMode, MIGRequestError, pod_mig_mode
from apis.pod_annotations import Placement, read_placement
from apis.pods import as_pod_dict
from apis.request import RequestError, parse_pod, pod_cpu_memory
from apis.translation import TranslationRules
from scheduler_plugin.core.api import LabelRequirement, PodRequest, PodUID
from scheduler_plugin.core.labels import OPERATORS, values_problem

#: Owner kinds whose pods form one job (a JobSet's pods are owned by its child Jobs: see job_key).
JOB_OWNER_KINDS = ("Job", "ReplicaSet")

_AFFINITY_PATH = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def pod_request_from_pod(
    pod: Mapping[str, Any] | Any, *, rules: TranslationRules | None = None
) -> PodRequest:
    """The core's view of `pod`. Raises RequestError when the pod is invalid."""
    data = as_pod_dict(pod)
    meta = _mapping(data.get("metadata"))
    spec = _mapping(data.get("spec"))
    annotations = _str_mapping(meta.get("annotations"))
    labels = _str_mapping(meta.get("labels"))
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or meta.get("generateName") or "")
    errors: list[str] = []

    device = None
    device_ok = True
    try:
        device = parse_pod(data, rules=rules)
    except RequestError as error:
        errors.extend(error.errors)
        device_ok = False
    cpu_milli, memory_bytes = 0, 0
    try:
        cpu_milli, memory_bytes = pod_cpu_memory(data)
    except RequestError as error:
        errors.extend(error.errors)

    # The same reading as fgpuctl validate and the webhook (apis/pod_check.py), so they refuse alike.
    placement = Placement()
    try:
        placement = read_placement(annotations)
    except RequestError as error:
        errors.extend(error.errors)
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        errors.append(f"spec.nodeSelector: {selector!r} must be a map of label key to value")
        selector = {}
    terms = _affinity_terms(spec, errors)
    mig_mode = MIGMode.ANY
    try:
        cards = (device.gpus if device else 0) if device_ok else None
        mig_mode = pod_mig_mode(annotations, cards=cards, whole=bool(device and device.whole))
    except MIGRequestError as error:
        errors.append(str(error))
    if errors:
        raise RequestError(errors)
    uid = str(meta.get("uid") or f"{namespace}/{name}")
    return PodRequest(
        uid=PodUID(uid),
        namespace=namespace,
        name=name,
        device=device,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        model_use=placement.model_use,
        model_avoid=placement.model_avoid,
        topology_scope=placement.topology_scope,
        job_key=job_key(meta, namespace=namespace, explicit=placement.job_key, labels=labels),
        node_selector={str(k): str(v) for k, v in selector.items()},
        affinity_terms=terms,
        mig_mode=mig_mode,
    )


def job_key(meta: Mapping[str, Any], *, namespace: str, explicit: str, labels: Mapping[str, str]) -> str:
    """The pod's job key, or "" when it belongs to no job; `explicit` is its checked fgpu.io/job-key."""
    if explicit:
        return f"{namespace}/{explicit}"
    for label in (names.POD_GROUP_LABEL, names.POD_GROUP_LABEL_LEGACY):
        group = labels.get(label, "").strip()
        if group:
            return f"{namespace}/pod-group/{group}"
    # Before the owner: the owner of a JobSet's pod is one child Job of many.
    jobset = labels.get(names.JOBSET_NAME_LABEL, "").strip()
    if jobset:
        return f"{namespace}/jobset/{jobset}"
    owners = [o for o in meta.get("ownerReferences") or () if isinstance(o, Mapping)]
    # The controlling owner first: it is the one that made the pod.
    owners.sort(key=lambda o: not o.get("controller"))
    for owner in owners:
        if owner.get("kind") in JOB_OWNER_KINDS and owner.get("uid"):
            return f"{owner['kind']}/{owner['uid']}"
    return ""


def _affinity_terms(spec: Mapping[str, Any], errors: list[str]) -> tuple[tuple[LabelRequirement, ...], ...]:
    affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    raw_terms = required.get("nodeSelectorTerms") or []
    terms = []
    for t, term in enumerate(raw_terms if isinstance(raw_terms, list) else []):
        term_map = _mapping(term)
        requirements = []
        for field, entries in (
            ("matchExpressions", term_map.get("matchExpressions")),
            ("matchFields", term_map.get("matchFields")),
        ):
            for e, entry in enumerate(entries or []):
                where = f"{_AFFINITY_PATH}.nodeSelectorTerms[{t}].{field}[{e}]"
                requirement = _requirement(
                    _mapping(entry), where=where, fields=field == "matchFields", errors=errors
                )
                if requirement is not None:
                    requirements.append(requirement)
        terms.append(tuple(requirements))
    return tuple(terms)


def _requirement(
    entry: Mapping[str, Any], *, where: str, fields: bool, errors: list[str]
) -> LabelRequirement | None:
    key = str(entry.get("key") or "")
    operator = str(entry.get("operator") or "")
    values = tuple(str(v) for v in entry.get("values") or ())
    if not key:
        errors.append(f"{where}.key: missing; name the node label to match")
        return None
    if fields and key != names.NODE_NAME_FIELD:
        errors.append(f"{where}.key: {key!r} is not a supported node field; only {names.NODE_NAME_FIELD} is")
        return None
    if operator not in OPERATORS:
        errors.append(f"{where}.operator: {operator!r} is not one of {', '.join(OPERATORS)}")
        return None
    problem = values_problem(operator, values)
    if problem is not None:
        errors.append(f"{where}.values: {problem}")
        return None
    return LabelRequirement(key=key, operator=operator, values=values)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_mapping(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}
