"""A ValidatingAdmissionPolicy evaluated as the API server does, for the policies in hack/deploy/.

The API double (tests/kubeapi) runs no admission, and no kube-apiserver can run here. So the
policy's own CEL expressions, read from the shipped YAML, are evaluated with cel-python (`celpy`, a
maintained CEL implementation) over AdmissionRequest-shaped inputs, following the API server's
steps: match the resource rules, then every match condition (any false: the policy does not
apply), then the variables in order, then each validation (false: denied, with its
messageExpression). An evaluation error denies under failurePolicy Fail, as it would there.

What this does not check is what only cel-go's type checker sees at policy creation (field types
from the OpenAPI schema); `kubernetes-validate` checks the objects' shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionRequest the policies read."""

    operation: str  # CREATE, UPDATE, DELETE
    username: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None = None
    resource: str = "pods"
    group: str = ""
    subresource: str = ""
    extra: Mapping[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""


_ENV = celpy.Environment()


def _evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    program = _ENV.program(_ENV.compile(expression))
    return program.evaluate(dict(activation))


def _matches(policy: Mapping[str, Any], request: Request) -> bool:
    resource = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        if request.group not in rule["apiGroups"] and "*" not in rule["apiGroups"]:
            continue
        if request.operation not in rule["operations"] and "*" not in rule["operations"]:
            continue
        for wanted in rule["resources"]:
            if wanted in ("*", resource) or (wanted.endswith("/*") and request.subresource and wanted[:-2] == request.resource):
                return True
    return False


def admit(policy: Mapping[str, Any], request: Request) -> Verdict:
    """What the API server answers `request` under `policy` (bound with validationActions [Deny])."""
    if not _matches(policy, request):
        return Verdict(True)
    spec = policy["spec"]
    activation: dict[str, Any] = {
        "object": json_to_cel(dict(request.object)) if request.object is not None else None,
        "oldObject": json_to_cel(dict(request.old_object)) if request.old_object is not None else None,
        "request": json_to_cel(
            {
                "operation": request.operation,
                "userInfo": {"username": request.username, "extra": dict(request.extra)},
                "resource": {"group": request.group, "version": "v1", "resource": request.resource},
                "subResource": request.subresource,
            }
        ),
    }
    fail = spec.get("failurePolicy", "Fail") == "Fail"
    try:
        for condition in spec.get("matchConditions", []):
            if not bool(_evaluate(condition["expression"], activation)):
                return Verdict(True)
        variables: dict[Any, Any] = {}
        for variable in spec.get("variables", []):
            activation["variables"] = celtypes.MapType(variables)
            variables[celtypes.StringType(variable["name"])] = _evaluate(variable["expression"], activation)
        activation["variables"] = celtypes.MapType(variables)
        for validation in spec["validations"]:
            if not bool(_evaluate(validation["expression"], activation)):
                if "messageExpression" in validation:
                    return Verdict(False, str(_evaluate(validation["messageExpression"], activation)))
                return Verdict(False, str(validation.get("message", "")))
    except CELEvalError as exc:
        return Verdict(not fail, f"policy evaluation failed: {exc}")
    return Verdict(True)
