"""Graceful pod deletion, after kube-apiserver's `rest.BeforeDelete` and the pod strategy's `CheckGracefulDelete`.

A pod bound to a node is not removed by a delete: the server stamps
`metadata.deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`
and the pod stays, terminating, until its kubelet has stopped the containers
and confirms with a delete of grace 0. The grace is the DeleteOptions'
`gracePeriodSeconds`, else the pod's `spec.terminationGracePeriodSeconds`,
else 30 (its API default, which a pod seeded with `put_object` skipped); it is 0 for a pod on no node or in a terminal phase (nothing runs to
stop), and a negative one counts as 1. A later delete may only shorten it.
Pure functions: the store applies the outcome under its lock.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from typing import Any

from tests.kubeapi import errors

_TIME = "%Y-%m-%dT%H:%M:%SZ"
_TERMINAL_PHASES = ("Failed", "Succeeded")
_DEFAULT_GRACE_S = 30  # core/v1 defaulting of spec.terminationGracePeriodSeconds


class Outcome(enum.Enum):
    #: Already terminating with a grace at least as short: nothing changes.
    PENDING = "pending"
    #: Store the marked object; it also goes at once if its grace is 0 and no finalizer holds it.
    GRACEFUL = "graceful"
    #: No grace applies (already due): remove now, or mark with grace 0 while finalizers hold it.
    IMMEDIATE = "immediate"


def requested_grace(options: Mapping[str, Any]) -> int | None:
    """DeleteOptions.gracePeriodSeconds (None when absent); negative values count as 1, as on the real delete path."""
    value = options.get("gracePeriodSeconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.bad_request(
            f"DeleteOptions.gracePeriodSeconds={value!r}: must be an integer number of seconds (0 deletes at once)"
        )
    return 1 if value < 0 else value


def grace_from_query(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.bad_request(
            f"invalid gracePeriodSeconds={text!r}: must be an integer number of seconds (0 deletes at once)"
        ) from None


def _shift(timestamp: str, seconds: int) -> str:
    moment = datetime.datetime.strptime(timestamp, _TIME).replace(tzinfo=datetime.UTC)
    return (moment + datetime.timedelta(seconds=seconds)).strftime(_TIME)


def before_delete(pod: dict[str, Any], requested: int | None, *, now: str) -> Outcome:
    """Decides a delete of `pod` (a copy the caller owns), stamping its metadata when the outcome is GRACEFUL."""
    meta = pod.setdefault("metadata", {})
    current = meta.get("deletionGracePeriodSeconds")
    if meta.get("deletionTimestamp"):
        if not current:
            return Outcome.IMMEDIATE
        if requested is None or requested >= current:
            return Outcome.PENDING
        meta["deletionTimestamp"] = _shift(meta["deletionTimestamp"], requested - current)
        meta["deletionGracePeriodSeconds"] = requested
        return Outcome.GRACEFUL
    spec = pod.get("spec") or {}
    default = spec.get("terminationGracePeriodSeconds")
    period = requested if requested is not None else int(_DEFAULT_GRACE_S if default is None else default)
    if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
        period = 0
    period = 1 if period < 0 else period
    meta["deletionTimestamp"] = _shift(now, period)
    meta["deletionGracePeriodSeconds"] = period
    if int(meta.get("generation") or 0) > 0:
        meta["generation"] = int(meta["generation"]) + 1
    return Outcome.GRACEFUL
