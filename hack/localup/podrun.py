"""Runs one pod through a CRI endpoint the way kubelet does, and keeps what each container saw.

kubelet's order: RunPodSandbox; each init container in turn, created, started
and waited for until it exits 0 (a failure stops the pod there); then every
app container created and started, in spec order. Each container's own
environment is read from what it printed (`env`), or, for one left running,
from `env` run in it with ExecSync (the runtime hands an exec the container's
own process environment).

A `PodRun` is the handle on a pod the node runs: `run` again retries what
did not get created (kubelet retries a refused CreateContainer the same
way), and `remove` takes it down, as kubelet does for a deleted pod.

What kubelet sends and this sends too: the pod's labels and annotations on
the sandbox, kubelet's `io.kubernetes.*` labels, each container's command,
args, env (`value` and the `fieldRef`s below) and `securityContext`
`runAsUser`/`runAsGroup` (the container's, else the pod's). Nothing else of
the spec reaches the runtime; in particular no extended resources do.
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hack.localup import cri, report
from hack.localup.report import ContainerOutcome, ContainerState

#: fieldRef paths kubelet resolves for env, as far as this runner supports them
_FIELD_REFS = {
    "metadata.name": lambda pod, node: pod["metadata"]["name"],
    "metadata.namespace": lambda pod, node: pod["metadata"]["namespace"],
    "metadata.uid": lambda pod, node: pod["metadata"]["uid"],
    "spec.nodeName": lambda pod, node: node,
}


class PodSpecError(ValueError):
    """A part of the pod spec this runner cannot play (say which, so the test can be changed)."""


def prepare(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the pod as the API server would hand it to kubelet: a fresh UID, a namespace."""
    pod = copy.deepcopy(dict(pod_spec))
    meta = pod.setdefault("metadata", {})
    meta["uid"] = str(uuid.uuid4())
    meta.setdefault("namespace", "default")
    pod.setdefault("spec", {})
    return pod


@dataclass
class PodRun:
    """A pod on the node: its sandbox and, per container, what became of it so far."""

    pod: dict[str, Any]
    node: str
    sandbox_config: Any
    sandbox_id: str = ""
    #: by container name, init containers first, in the order they ran
    outcomes: dict[str, ContainerOutcome] = field(default_factory=dict)
    #: every container created, earlier attempts too (all of them are removed with the pod)
    created: list[str] = field(default_factory=list)
    #: the attempt number each container was last created with
    attempts: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.sandbox_config.annotations)

    def container(self, name: str) -> ContainerOutcome:
        try:
            return self.outcomes[name]
        except KeyError:
            raise KeyError(f"pod {self.namespace}/{self.name} has no container {name!r} run yet") from None

    @property
    def containers(self) -> tuple[ContainerOutcome, ...]:
        return tuple(self.outcomes.values())

    @property
    def container_ids(self) -> tuple[str, ...]:
        return tuple(self.created)

    def problem(self) -> str:
        """The first container that did not succeed and why; "" when every one did (or runs)."""
        for c in self.outcomes.values():
            if c.state in (ContainerState.EXITED, ContainerState.REFUSED) and not c.succeeded:
                return f"container {c.name}: {c.describe()}"
        return ""


def start(
    kubelet: cri.Kubelet, pod: Mapping[str, Any], *, annotations: Mapping[str, str], node: str, pods_dir: str,
    pod_cgroups: bool = False,
) -> PodRun:
    """RunPodSandbox for a prepared pod with `annotations` (the pod's own plus the scheduler's).

    `pod_cgroups`: in the pod's own cgroup (`cri.pod_cgroup`), as kubelet puts it, so the agent can map
    its processes to it; off, the runtime's default (no cgroups left behind to remove)."""
    meta = pod["metadata"]
    log_dir = os.path.join(pods_dir, f"{meta['namespace']}_{meta['name']}_{meta['uid']}")
    os.makedirs(log_dir, exist_ok=True)
    config = cri.sandbox_config(
        name=str(meta["name"]),
        namespace=str(meta["namespace"]),
        uid=str(meta["uid"]),
        labels=meta.get("labels") or {},
        annotations=annotations,
        log_directory=log_dir,
        cgroup_parent=cri.pod_cgroup(str(meta["uid"])) if pod_cgroups else "",
    )
    run = PodRun(pod=dict(pod), node=node, sandbox_config=config)
    run.sandbox_id = kubelet.run_pod_sandbox(config)
    return run


def run(kubelet: cri.Kubelet, pod_run: PodRun, *, leave_running: bool = False, timeout_s: float = 30.0) -> PodRun:
    """Runs what has not run yet: init containers to completion, then the app containers.

    Without `leave_running`, waits for every app container to exit. With it,
    app containers that have not exited when they are looked at are left
    running (for pods whose containers run on, e.g. `sleep`), their env read
    through ExecSync. A container refused before is tried again.
    """
    spec = pod_run.pod.get("spec") or {}
    inits = list(spec.get("initContainers") or [])
    apps = list(spec.get("containers") or [])
    for i, container in enumerate(inits):
        done = pod_run.outcomes.get(container["name"])
        if done is not None and done.succeeded:
            continue
        outcome = _create_and_start(kubelet, pod_run, container, init=True)
        if outcome.state is ContainerState.STARTED:
            outcome = _wait(kubelet, outcome, timeout_s=timeout_s, leave_running=False)
        pod_run.outcomes[outcome.name] = outcome
        if not outcome.succeeded:
            # kubelet starts nothing after an init container that did not complete.
            for later, is_init in [(c, True) for c in inits[i + 1:]] + [(c, False) for c in apps]:
                later_name = str(later["name"])
                not_run = ContainerOutcome(name=later_name, init=is_init, state=ContainerState.NOT_RUN)
                pod_run.outcomes.setdefault(later_name, not_run)
            return pod_run
    started: list[str] = []
    for container in apps:
        done = pod_run.outcomes.get(container["name"])
        if done is not None and done.state not in (ContainerState.REFUSED, ContainerState.NOT_RUN):
            continue
        outcome = _create_and_start(kubelet, pod_run, container, init=False)
        pod_run.outcomes[outcome.name] = outcome
        if outcome.state is ContainerState.STARTED:
            started.append(outcome.name)
    for name in started:
        pod_run.outcomes[name] = _wait(kubelet, pod_run.outcomes[name], timeout_s=timeout_s, leave_running=leave_running)
    return pod_run


def remove(kubelet: cri.Kubelet, pod_run: PodRun) -> None:
    """What kubelet does for a deleted pod: stop its containers and sandbox, then remove them."""
    for container_id in pod_run.container_ids:
        with contextlib.suppress(cri.CRIError):
            kubelet.stop_container(container_id, timeout_s=0)
    if pod_run.sandbox_id:
        with contextlib.suppress(cri.CRIError):
            kubelet.stop_pod_sandbox(pod_run.sandbox_id)
    for container_id in pod_run.container_ids:
        with contextlib.suppress(cri.CRIError):
            kubelet.remove_container(container_id)
    if pod_run.sandbox_id:
        with contextlib.suppress(cri.CRIError):
            kubelet.remove_pod_sandbox(pod_run.sandbox_id)


def _create_and_start(kubelet: cri.Kubelet, pod_run: PodRun, container: Mapping[str, Any], *, init: bool) -> ContainerOutcome:
    name = str(container["name"])
    # A container created before is created again with the next attempt number, as kubelet does
    # (the runtime refuses a second container of the same name and attempt in one sandbox).
    attempt = pod_run.attempts[name] + 1 if name in pod_run.attempts else 0
    config = container_config(pod_run.pod, container, node=pod_run.node, attempt=attempt)
    try:
        container_id = kubelet.create_container(
            sandbox_id=pod_run.sandbox_id, config=config, sandbox_config=pod_run.sandbox_config
        )
    except cri.CRIError as exc:
        return ContainerOutcome(
            name=name, init=init, state=ContainerState.REFUSED, error=exc.details, error_code=exc.code.name
        )
    pod_run.attempts[name] = attempt
    pod_run.created.append(container_id)
    try:
        kubelet.start_container(container_id)
    except cri.CRIError as exc:
        return ContainerOutcome(
            name=name, init=init, container_id=container_id, state=ContainerState.REFUSED,
            error=f"StartContainer: {exc.details}", error_code=exc.code.name,
        )
    return ContainerOutcome(name=name, init=init, container_id=container_id, state=ContainerState.STARTED)


def _wait(kubelet: cri.Kubelet, outcome: ContainerOutcome, *, timeout_s: float, leave_running: bool) -> ContainerOutcome:
    container_id = outcome.container_id
    if leave_running:
        status = kubelet.container_status(container_id)
        if status.state != cri.CONTAINER_EXITED:
            return _running(kubelet, outcome)
    result = kubelet.wait_exited(container_id, timeout_s=timeout_s)
    if not result.exited:
        return replace(_running(kubelet, outcome), error=f"still running after {timeout_s:.0f}s")
    lines = _log_lines(result.log_path)
    return replace(
        outcome, state=ContainerState.EXITED, exit_code=result.exit_code,
        env=report.env_from_lines(lines), output=tuple(lines),
    )


def _running(kubelet: cri.Kubelet, outcome: ContainerOutcome) -> ContainerOutcome:
    env: dict[str, str] = {}
    error = ""
    try:
        result = kubelet.exec_sync(outcome.container_id, ["env"])
        env = report.env_from_lines(result.stdout.splitlines())
    except cri.CRIError as exc:
        error = f"ExecSync env: {exc}"
    return replace(outcome, state=ContainerState.RUNNING, env=env, error=error)


def _log_lines(path: str) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return report.parse_cri_log(f.read())
    except FileNotFoundError:
        return []


def container_config(pod: Mapping[str, Any], container: Mapping[str, Any], *, node: str, attempt: int = 0) -> Any:
    """The ContainerConfig kubelet builds for `container` of `pod`."""
    meta = pod["metadata"]
    name = str(container["name"])
    pod_security = (pod.get("spec") or {}).get("securityContext") or {}
    security = container.get("securityContext") or {}
    run_as_user = security.get("runAsUser", pod_security.get("runAsUser"))
    run_as_group = security.get("runAsGroup", pod_security.get("runAsGroup"))
    return cri.container_config(
        name=name,
        image=str(container["image"]),
        command=[str(c) for c in container.get("command") or []],
        args=[str(a) for a in container.get("args") or []],
        env=container_env(pod, container, node=node),
        log_path=f"{name}.log",
        labels=cri.container_labels(
            pod_name=str(meta["name"]), pod_namespace=str(meta["namespace"]), pod_uid=str(meta["uid"]),
            container_name=name,
        ),
        run_as_user=None if run_as_user is None else int(run_as_user),
        run_as_group=None if run_as_group is None else int(run_as_group),
        attempt=attempt,
    )


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], *, node: str) -> dict[str, str]:
    """A container's `env` as kubelet resolves it: values, and fieldRefs to the pod's own fields."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        key = str(item["name"])
        if "valueFrom" not in item:
            env[key] = str(item.get("value", ""))
            continue
        path = ((item["valueFrom"] or {}).get("fieldRef") or {}).get("fieldPath", "")
        if path not in _FIELD_REFS:
            raise PodSpecError(
                f"container {container['name']} env {key}: only value and fieldRef to "
                f"{', '.join(sorted(_FIELD_REFS))} are supported here"
            )
        env[key] = str(_FIELD_REFS[path](pod, node))
    return env
