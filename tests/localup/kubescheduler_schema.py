"""A JSON schema for `kubescheduler.config.k8s.io/v1` KubeSchedulerConfiguration.

kube-scheduler's configuration is a component config: the API server never
serves it, so the Kubernetes OpenAPI documents that kubernetes-validate ships
have no schema for it. This one is written from the Go types in
k8s.io/kube-scheduler/config/v1 (types.go, extender types) for the fields a
deployment sets, with unknown fields refused (kube-scheduler's strict
decoding refuses them too) so a misspelt key fails here, not at startup.
"""

from __future__ import annotations

from typing import Any

_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"}

_LEADER_ELECTION: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "leaderElect": {"type": "boolean"},
        "leaseDuration": _DURATION,
        "renewDeadline": _DURATION,
        "retryPeriod": _DURATION,
        "resourceLock": {"enum": ["leases", "endpointsleases", "configmapsleases"]},
        "resourceName": {"type": "string", "minLength": 1},
        "resourceNamespace": {"type": "string", "minLength": 1},
    },
}

_CLIENT_CONNECTION: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "kubeconfig": {"type": "string"},
        "acceptContentTypes": {"type": "string"},
        "contentType": {"type": "string"},
        "qps": {"type": "number"},
        "burst": {"type": "integer"},
    },
}

_PLUGIN_SET: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "array", "items": {"$ref": "#/$defs/plugin"}},
        "disabled": {"type": "array", "items": {"$ref": "#/$defs/plugin"}},
    },
}

_EXTENSION_POINTS = (
    "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
    "reserve", "permit", "preBind", "bind", "postBind", "multiPoint",
)

_PROFILE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["schedulerName"],
    "properties": {
        "schedulerName": {"type": "string", "minLength": 1},
        "percentageOfNodesToScore": {"type": "integer", "minimum": 0, "maximum": 100},
        "plugins": {
            "type": "object",
            "additionalProperties": False,
            "properties": {point: _PLUGIN_SET for point in _EXTENSION_POINTS},
        },
        "pluginConfig": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
            },
        },
    },
}

_EXTENDER: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["urlPrefix"],
    "properties": {
        "urlPrefix": {"type": "string", "pattern": "^https?://"},
        "filterVerb": {"type": "string"},
        "preemptVerb": {"type": "string"},
        "prioritizeVerb": {"type": "string"},
        "weight": {"type": "integer", "minimum": 1},
        "bindVerb": {"type": "string"},
        "enableHTTPS": {"type": "boolean"},
        "tlsConfig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "insecure": {"type": "boolean"},
                "serverName": {"type": "string"},
                "certFile": {"type": "string"},
                "keyFile": {"type": "string"},
                "caFile": {"type": "string"},
                "certData": {"type": "string"},
                "keyData": {"type": "string"},
                "caData": {"type": "string"},
            },
        },
        "httpTimeout": _DURATION,
        "nodeCacheCapable": {"type": "boolean"},
        "managedResources": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1}, "ignoredByScheduler": {"type": "boolean"}},
            },
        },
        "ignorable": {"type": "boolean"},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "profiles"],
    "$defs": {
        "plugin": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "weight": {"type": "integer"}},
        }
    },
    "properties": {
        "apiVersion": {"const": "kubescheduler.config.k8s.io/v1"},
        "kind": {"const": "KubeSchedulerConfiguration"},
        "parallelism": {"type": "integer", "minimum": 1},
        "leaderElection": _LEADER_ELECTION,
        "clientConnection": _CLIENT_CONNECTION,
        "enableProfiling": {"type": "boolean"},
        "enableContentionProfiling": {"type": "boolean"},
        "percentageOfNodesToScore": {"type": "integer", "minimum": 0, "maximum": 100},
        "podInitialBackoffSeconds": {"type": "integer", "minimum": 1},
        "podMaxBackoffSeconds": {"type": "integer", "minimum": 1},
        "profiles": {"type": "array", "minItems": 1, "items": _PROFILE},
        "extenders": {"type": "array", "items": _EXTENDER},
        "delayCacheUntilActive": {"type": "boolean"},
    },
}
