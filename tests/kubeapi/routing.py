"""URL paths of the Kubernetes REST API, parsed into what they address.

    /api/v1/[watch/][namespaces/<ns>/]<plural>[/<name>[/<subresource>]]
    /apis/<group>/<version>/[watch/][namespaces/<ns>/]<plural>[/<name>[/<subresource>]]

plus the discovery paths. `/api/v1/namespaces/<name>[/status|/finalize]` is the
Namespace object itself, as kube-apiserver resolves the same ambiguity.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tests.kubeapi import errors

_NAMESPACE_SUBRESOURCES = ("status", "finalize")


class Target(enum.Enum):
    DISCOVERY = enum.auto()
    HEALTH = enum.auto()
    COLLECTION = enum.auto()
    OBJECT = enum.auto()


@dataclass(frozen=True)
class Route:
    target: Target
    group: str = ""
    version: str = ""
    plural: str = ""
    namespace: str | None = None
    name: str = ""
    subresource: str = ""
    #: The deprecated `/watch/` path prefix: same as `?watch=true`.
    watch: bool = False
    #: For DISCOVERY: the path segments.
    segments: tuple[str, ...] = ()


def parse(path: str) -> Route:
    segments = tuple(s for s in path.split("?", 1)[0].split("/") if s)
    if (
        segments in ((), ("version",), ("api",), ("apis",))
        or (segments[:1] == ("api",) and len(segments) == 2)
        or (segments[:1] == ("apis",) and len(segments) in (2, 3))
    ):
        return Route(Target.DISCOVERY, segments=segments)
    if segments[0] in ("healthz", "readyz", "livez"):
        return Route(Target.HEALTH, segments=segments)
    if segments[0] == "api":
        group, version, rest = "", segments[1], list(segments[2:])
    elif segments[0] == "apis":
        group, version, rest = segments[1], segments[2], list(segments[3:])
    else:
        raise errors.path_not_found(path)
    watch = False
    if rest and rest[0] == "watch":
        watch, rest = True, rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        raise errors.path_not_found(path)
    plural = rest[0]
    if len(rest) == 1:
        return Route(Target.COLLECTION, group, version, plural, namespace, watch=watch)
    return Route(
        Target.OBJECT,
        group,
        version,
        plural,
        namespace,
        rest[1],
        rest[2] if len(rest) == 3 else "",
        watch=watch,
    )
