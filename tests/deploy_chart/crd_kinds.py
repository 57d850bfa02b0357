"""Schemas for the custom resources the chart renders (cert-manager, Prometheus Operator).

kubernetes-validate knows only built-in kinds. These are the fields the chart writes, transcribed
from cert-manager.io/v1 (Certificate, Issuer) and monitoring.coreos.com/v1 (ServiceMonitor,
PrometheusRule); unknown fields fail, as the API server's structural schemas prune or refuse them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]

_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS},
    "additionalProperties": False,
}


def _kind(api_version: str, kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": _METADATA, "spec": spec},
        "additionalProperties": False,
    }


_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _STR, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": _STR},
    "additionalProperties": False,
}
_CERTIFICATE = _kind("cert-manager.io/v1", "Certificate", {
    "type": "object",
    "required": ["secretName", "issuerRef"],
    "properties": {
        "secretName": _STR,
        "duration": {"type": "string", "pattern": r"^(\d+(\.\d+)?(h|m|s))+$"},
        "renewBefore": {"type": "string", "pattern": r"^(\d+(\.\d+)?(h|m|s))+$"},
        "commonName": {"type": "string", "maxLength": 64},
        "dnsNames": {"type": "array", "items": _STR, "minItems": 1},
        "issuerRef": _ISSUER_REF,
    },
    "additionalProperties": False,
})
_ISSUER = _kind("cert-manager.io/v1", "Issuer", {
    "type": "object",
    "properties": {"selfSigned": {"type": "object", "additionalProperties": False}},
    "additionalProperties": False,
    "minProperties": 1,
})
#: The Operator's Duration type (a Prometheus duration such as 30s, 5m, 1h30m).
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "properties": {
        "port": _STR,
        "path": _STR,
        "interval": _DURATION,
        "relabelings": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sourceLabels": {"type": "array", "items": _STR}, "targetLabel": _STR},
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
_SERVICE_MONITOR = _kind("monitoring.coreos.com/v1", "ServiceMonitor", {
    "type": "object",
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": {"type": "object", "properties": {"matchLabels": _LABELS}, "additionalProperties": False},
        "endpoints": {"type": "array", "items": _ENDPOINT, "minItems": 1},
    },
    "additionalProperties": False,
})
_RULE = {
    "type": "object",
    "required": ["expr"],
    "properties": {
        "alert": _STR,
        "record": _STR,
        "expr": {"anyOf": [_STR, {"type": "integer"}]},  # the CRD's int-or-string
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _LABELS,
        "annotations": _LABELS,
    },
    "additionalProperties": False,
    # An alert or a recording rule, never both nor neither (the Operator's admission webhook and
    # Prometheus itself refuse the rest).
    "oneOf": [{"required": ["alert"], "not": {"required": ["record"]}}, {"required": ["record"], "not": {"required": ["alert"]}}],
}
_PROMETHEUS_RULE = _kind("monitoring.coreos.com/v1", "PrometheusRule", {
    "type": "object",
    "required": ["groups"],
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": _DURATION,
                    "limit": {"type": "integer"},
                    "partial_response_strategy": _STR,
                    "rules": {"type": "array", "items": _RULE},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
})

#: (API group, kind) -> schema
CUSTOM_KINDS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io", "Certificate"): _CERTIFICATE,
    ("cert-manager.io", "Issuer"): _ISSUER,
    ("monitoring.coreos.com", "ServiceMonitor"): _SERVICE_MONITOR,
    ("monitoring.coreos.com", "PrometheusRule"): _PROMETHEUS_RULE,
}


def custom_kind_errors(obj: Mapping[str, Any]) -> list[str]:
    schema = CUSTOM_KINDS[(str(obj["apiVersion"]).split("/")[0], str(obj["kind"]))]
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)
    ]
