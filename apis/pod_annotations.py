"""The pod's placement annotations, read and checked: GPU models, topology scope, job key.

One reading for all three that judge a pod: the scheduler (core/podrequest.py),
`fgpuctl validate` and the admission webhook (both through apis/pod_check.py).
So a bad value is refused at `kubectl apply` with the line the scheduler would
otherwise leave on a Pending pod, naming the annotation, its value and the fix::

    annotation fgpu.io/gpu-topology-scope: 'rack' is not a topology scope; use one of node, nvlink, pcie, numa

What the annotations hold (docs/requesting-gpus.md has the pod author's side)::

    fgpu.io/gpu-model-use: A100-SXM4-80GB,H100-SXM5-80GB   # only these models
    fgpu.io/gpu-model-avoid: T4                            # never these
    fgpu.io/gpu-topology-scope: nvlink                     # nvlink | pcie | numa | node
    fgpu.io/job-key: rl-run-7                              # same key, same model

Model names are compared in their label form (`apis.inventory.model_label`:
"NVIDIA A100-SXM4-80GB" reads as "A100-SXM4-80GB", as on the node label). A
blank annotation is no annotation. Values are pod authors' text, echoed in
Events and on the page: a message shows them escaped and cut short.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apis import names
from apis.device_request import RequestError
from apis.inventory import model_label
from apis.quoting import quoted

#: The values of fgpu.io/gpu-topology-scope: "node" (anywhere on the node, the default), then tighter ones.
TOPOLOGY_SCOPES = ("node", "nvlink", "pcie", "numa")
#: The longest job key: it is held per job and printed in the scheduler's reasons (a Kubernetes name's limit).
JOB_KEY_MAX = 253
#: The annotations read here, in the order their problems are listed.
ANNOTATIONS = (names.GPU_MODEL_USE, names.GPU_MODEL_AVOID, names.GPU_TOPOLOGY_SCOPE, names.JOB_KEY)

@dataclass(frozen=True)
class Placement:
    """What the pod's annotations ask of its placement (empty: nothing)."""

    #: Models the pod may use, in label form; empty: any.
    model_use: frozenset[str] = frozenset()
    #: Models the pod must not use, in label form.
    model_avoid: frozenset[str] = frozenset()
    #: One of TOPOLOGY_SCOPES, or "" when the pod names none (the same as "node").
    topology_scope: str = ""
    #: The fgpu.io/job-key annotation, trimmed; "" when absent. Not yet namespaced (core/podrequest.py does).
    job_key: str = ""


def read_placement(annotations: Mapping[str, str]) -> Placement:
    """The pod's placement annotations. Raises RequestError with one line per problem."""
    errors: list[str] = []
    model_use = _models(annotations, names.GPU_MODEL_USE, errors)
    model_avoid = _models(annotations, names.GPU_MODEL_AVOID, errors)
    for model in sorted(model_use & model_avoid):
        errors.append(
            f"annotation {names.GPU_MODEL_AVOID}: {model!r} is also in {names.GPU_MODEL_USE}; a model cannot be "
            "both used and avoided: drop it from one of the two"
        )
    scope = _topology_scope(annotations, errors)
    key = _job_key(annotations, errors)
    if errors:
        raise RequestError(errors)
    return Placement(model_use=model_use, model_avoid=model_avoid, topology_scope=scope, job_key=key)


def _models(annotations: Mapping[str, str], key: str, errors: list[str]) -> frozenset[str]:
    text = annotations.get(key, "")
    models = set()
    for item in text.split(","):
        if not item.strip():
            continue  # "A100,T4," and "A100, T4" are fine
        label = model_label(item)
        if not label:
            errors.append(
                f"annotation {key}: {quoted(item.strip())} is not a GPU model; write models such as "
                f"A100-SXM4-80GB,T4, as the node label {names.NODE_GPU_MODEL} has them (kubectl fgpu inspect "
                "lists the cluster's)"
            )
            continue
        models.add(label)
    return frozenset(models)


def _topology_scope(annotations: Mapping[str, str], errors: list[str]) -> str:
    text = annotations.get(names.GPU_TOPOLOGY_SCOPE, "")
    scope = text.strip().lower()
    if scope and scope not in TOPOLOGY_SCOPES:
        errors.append(
            f"annotation {names.GPU_TOPOLOGY_SCOPE}: {quoted(text)} is not a topology scope; use one of "
            f"{', '.join(TOPOLOGY_SCOPES)}"
        )
        return ""
    return scope


def _job_key(annotations: Mapping[str, str], errors: list[str]) -> str:
    text = annotations.get(names.JOB_KEY, "")
    key = text.strip()
    if len(key) > JOB_KEY_MAX:
        errors.append(
            f"annotation {names.JOB_KEY}: {quoted(key)} is {len(key)} characters long; a job key is at most "
            f"{JOB_KEY_MAX} characters: use a short name for the job, such as rl-run-7"
        )
        return ""
    if not key.isprintable():
        errors.append(
            f"annotation {names.JOB_KEY}: {quoted(key)} holds a line break or another control character; "
            "write the key on one line in printable characters, such as rl-run-7"
        )
        return ""
    return key

