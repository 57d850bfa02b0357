"""The local stack: containerd, fgpu-scheduler, fgpu-agent and fgpu-runtime-proxy, each on its own
sockets under one work directory.

Every process started is written to `state.json` in that directory before
anything else happens, so a later run (or `--down`) can stop what an earlier
one left behind, even one killed with SIGKILL: that is what makes the
command idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.isolation import registry as isolation_registry
from apis import names
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from apis.keyfiles import private_pem, public_pem
from apis.signing import SigningKey
from tests.containerd.harness import Containerd

NODE_NAME = "fgpu-local"
STATE_FILE = "state.json"
#: The hook registration a node installs; the stack uses it as shipped, with only the endpoint changed.
HOOK_REGISTRATION = os.path.join("hack", "systemd", "10-fgpu-agent-hook.yaml")


class StackError(RuntimeError):
    """A part of the stack did not come up; the message says which and carries its log tail."""


@dataclass(frozen=True)
class Paths:
    """Where everything lives under the work directory (kept short: unix socket paths max 107 bytes)."""

    root: str

    def at(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def containerd_dir(self) -> str:
        return self.at("containerd")

    @property
    def scheduler_sock(self) -> str:
        return self.at("scheduler.sock")

    @property
    def agent_sock(self) -> str:
        return self.at("agent-hooks.sock")

    @property
    def proxy_sock(self) -> str:
        return self.at("runtimeproxy.sock")

    @property
    def proxy_admin_sock(self) -> str:
        return self.at("runtimeproxy-admin.sock")

    @property
    def hooks_dir(self) -> str:
        return self.at("hooks.d")

    @property
    def logs_dir(self) -> str:
        return self.at("logs")

    @property
    def pods_dir(self) -> str:
        return self.at("pods")

    @property
    def signing_key(self) -> str:
        """The scheduler's Ed25519 private key (PEM)."""
        return self.at("signing-key")

    @property
    def verifying_keys(self) -> str:
        """The agent's public keys: the directory a ConfigMap volume would be."""
        return self.at("verifying-keys")

    @property
    def agent_config(self) -> str:
        return self.at("agent.yaml")

    @property
    def hook_registration(self) -> str:
        return os.path.join(self.hooks_dir, "10-fgpu-agent.yaml")

    @property
    def scheduler_db(self) -> str:
        return self.at("scheduler.db")


@dataclass(frozen=True)
class Settings:
    """What the person running local-up chose."""

    repo: str
    inventory: str
    #: an isolation backend the agent registers (agent/isolation/)
    isolation: str = names.ISOLATION_HAMI_CORE
    bin_dir: str = ""  # where the console scripts are; default: beside this Python
    #: run fgpu-descheduler (dry-run) against the API this kubeconfig names; "" = not at all
    descheduler_kubeconfig: str = ""

    def command(self, name: str) -> str:
        directory = self.bin_dir or os.path.dirname(sys.executable)
        return os.path.join(directory, name)


class Daemon:
    """One of our processes, logging to a file, in its own process group."""

    def __init__(
        self, name: str, argv: Sequence[str], *, log_path: str, cwd: str, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._cwd = cwd
        #: added to this process's environment
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._cwd,
                env={**os.environ, **self.env} if self.env else None,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *, grace_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def wait_until(self, ready: Callable[[], bool], *, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise StackError(f"{self.name} exited ({code}) before {what}; its log:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.05)
        raise StackError(f"{self.name}: no {what} after {timeout_s:.0f}s; its log:\n{self.log_tail()}")


def grpc_serving(address: str) -> bool:
    """True when the gRPC health service at `address` answers SERVING."""
    if address.startswith("unix://") and not os.path.exists(address.removeprefix("unix://")):
        return False
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def node_reported(address: str, node: str) -> bool:
    """True when the scheduler knows `node` with at least one GPU (the agent's report arrived)."""
    with grpc.insecure_channel(address) as channel:
        try:
            state = scheduler_pb2_grpc.SchedulerStub(channel).GetNodeState(  # type: ignore[no-untyped-call]
                scheduler_pb2.GetNodeStateRequest(node_names=[node]), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return any(n.node_name == node and len(n.gpus) > 0 for n in state.nodes)


class Stack:
    """Starts and stops the four processes; `start()` returns once every one answers.

    `stop_agent()` / `start_agent()` take fgpu-agent alone down and up again (a crash,
    an update), with containerd, the scheduler, the proxy and the pods left running.
    """

    def __init__(self, paths: Paths, settings: Settings) -> None:
        self.paths = paths
        self.settings = settings
        self.containerd = Containerd(base_dir=paths.containerd_dir)
        self.daemons: list[Daemon] = []

    # --- addresses the demo and the person poking at it use ---------------------------------
    @property
    def scheduler_address(self) -> str:
        return f"unix://{self.paths.scheduler_sock}"

    @property
    def agent_address(self) -> str:
        return f"unix://{self.paths.agent_sock}"

    @property
    def proxy_address(self) -> str:
        return f"unix://{self.paths.proxy_sock}"

    @property
    def proxy_admin_address(self) -> str:
        return f"unix://{self.paths.proxy_admin_sock}"

    def start(self, *, on_step: Callable[[str], None] = lambda _: None) -> None:
        p = self.paths
        for d in (p.root, p.logs_dir, p.hooks_dir, p.pods_dir):
            os.makedirs(d, exist_ok=True)
        # A key pair per run, as `fgpuctl keys generate` makes: the scheduler gets the private key,
        # the agent only the public one.
        key = SigningKey.generate()
        with open(p.signing_key, "wb") as f:
            f.write(private_pem(key))
        os.chmod(p.signing_key, 0o600)
        shutil.rmtree(p.verifying_keys, ignore_errors=True)
        os.makedirs(p.verifying_keys)
        with open(os.path.join(p.verifying_keys, f"{key.key_id}.pub"), "wb") as f:
            f.write(public_pem(key.public))
        self._save_state()

        on_step("containerd: starting, importing local images")
        self.containerd.start()
        self._save_state()
        self.containerd.import_images()

        on_step("fgpu-scheduler: embedded state in " + p.scheduler_db)
        scheduler = self._daemon(
            "fgpu-scheduler",
            [
                "--state", "embedded",
                "--db", p.scheduler_db,
                "--grpc-listen", self.scheduler_address,
                "--signing-key", p.signing_key,
                # A handful of demo pods teaches fgpu's workload learner nothing; binpack's
                # placements are the predictable ones the demo table explains.
                "--policy", "binpack",
            ],
        )
        scheduler.wait_until(lambda: grpc_serving(self.scheduler_address), what="gRPC health SERVING")

        on_step(f"fgpu-agent: fake NVML from {os.path.relpath(self.settings.inventory, self.settings.repo)}")
        self._daemon("fgpu-agent", self._agent_args())
        self._wait_agent_ready()

        on_step("fgpu-runtime-proxy: in front of containerd, fgpu-agent as GPU hook")
        self._write_hook_config()
        proxy = self._daemon(
            "fgpu-runtime-proxy",
            [
                "--listen", self.proxy_address,
                "--backend", self.containerd.address,
                "--hook-config-dir", p.hooks_dir,
                "--admin-listen", self.proxy_admin_address,
                "--metrics-listen", "",
            ],
        )
        proxy.wait_until(lambda: grpc_serving(self.proxy_admin_address), what="admin health SERVING")
        if self.settings.descheduler_kubeconfig:
            self._start_descheduler(on_step)

    def _start_descheduler(self, on_step: Callable[[str], None]) -> None:
        """fgpu-descheduler in dry-run against a Kubernetes API: the stack has none of its own (the
        scheduler keeps its state in SQLite), so the kubeconfig names one (`python -m tests.kubeapi`,
        a kind cluster). Copied under the work directory, so `--down` finds the process by its flags."""
        kubeconfig = self.paths.at("descheduler.kubeconfig")
        shutil.copyfile(self.settings.descheduler_kubeconfig, kubeconfig)
        on_step(f"fgpu-descheduler: dry-run, against {self.settings.descheduler_kubeconfig}")
        descheduler = self._daemon(
            "fgpu-descheduler",
            ["--kubeconfig", kubeconfig, "--interval", "10", "--pending-seconds", "30", "--metrics-port", "0"],
        )
        descheduler.wait_until(lambda: "started (" in descheduler.log_tail(), what="its first log line")

    # --- the agent alone, for tests of a node whose agent restarts or is down -----------------
    @property
    def agent(self) -> Daemon:
        return next(d for d in self.daemons if d.name == "fgpu-agent")

    def stop_agent(self) -> None:
        """SIGTERM to fgpu-agent, as systemd or the DaemonSet would on an update; the rest keeps running."""
        self.agent.stop()
        self._save_state()

    def start_agent(self) -> None:
        """Starts fgpu-agent again with the same flags; returns once it serves hooks and has reported."""
        agent = self.agent
        if not agent.alive():
            agent.start()
            self._save_state()
        self._wait_agent_ready()

    def restart_agent(self) -> None:
        self.stop_agent()
        self.start_agent()

    def _agent_args(self) -> list[str]:
        p = self.paths
        return [
            "--config", self._agent_config(),
            "--no-kubernetes",
            "--node-name", NODE_NAME,
            "--fake-nvml", self.settings.inventory,
            "--hook-listen", self.agent_address,
            "--isolation", self.settings.isolation,
            "--verifying-keys", p.verifying_keys,
            "--scheduler", self.scheduler_address,
            # No Kubernetes here: the admission sweep asks containerd which pods still exist.
            "--runtime-endpoint", self.containerd.address,
            "--metrics-listen", "",
        ]

    def _wait_agent_ready(self) -> None:
        agent = self.agent
        agent.wait_until(lambda: grpc_serving(self.agent_address), what="hook socket health SERVING")
        agent.wait_until(lambda: node_reported(self.scheduler_address, NODE_NAME), what="device report at the scheduler")

    def isolation_paths(self) -> dict[str, str]:
        """The agent config's `isolationPaths`, as the stack wrote them (host paths)."""
        with open(self.paths.agent_config) as f:
            config = yaml.safe_load(f)
        return {str(k): str(v) for k, v in (config.get("isolationPaths") or {}).items()}

    def bound_pod(self, uid: str) -> dict[str, Any] | None:
        """The pod as fgpu-scheduler stored it at Bind (its annotations are what it wrote), or None."""
        db = sqlite3.connect(f"file:{self.paths.scheduler_db}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT manifest FROM pods WHERE uid=?", (uid,)).fetchone()
        finally:
            db.close()
        manifest = json.loads(row[0]) if row else None
        return manifest if isinstance(manifest, dict) else None

    def _daemon(self, name: str, args: Sequence[str]) -> Daemon:
        daemon = Daemon(
            name,
            [self.settings.command(name), *args],
            log_path=os.path.join(self.paths.logs_dir, f"{name}.log"),
            cwd=self.paths.root,
        )
        daemon.start()
        self.daemons.append(daemon)
        self._save_state()
        return daemon

    def _agent_config(self) -> str:
        """The agent's config file: every isolation backend's host paths inside the work directory,
        laid out as on a node (`/usr/local/vgpu/libvgpu.so` -> `<workdir>/usr/local/vgpu/libvgpu.so`),
        so nothing lands in /usr. The backends come from the agent's registry."""
        p = self.paths
        isolation_paths: dict[str, str] = {}
        for key in isolation_registry.path_keys():
            if not key.on_host:
                continue
            path = p.at(key.default.lstrip("/"))
            isolation_paths[key.key] = path
            if key.is_file:
                # Stand-ins (HAMi-core's library and preload file): the busybox images are static,
                # so nothing is preloaded.
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
            else:
                os.makedirs(path, exist_ok=True)
        config = {
            "isolationPaths": isolation_paths,
            "checkpointPath": p.at("kubelet_internal_checkpoint"),
        }
        path = p.agent_config
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        return path

    def _write_hook_config(self) -> None:
        """The shipped registration (stages, failure policy, timeout as a node gets them), pointed at
        this stack's agent socket."""
        with open(os.path.join(self.settings.repo, HOOK_REGISTRATION)) as f:
            registration = yaml.safe_load(f)
        hooks = registration.get("hooks") if isinstance(registration, dict) else None
        if not isinstance(hooks, list) or not hooks:
            raise StackError(f"{HOOK_REGISTRATION}: expected a `hooks:` list with the fgpu-agent registration")
        for hook in hooks:
            if hook.get("name") == "fgpu-agent":
                hook["endpoint"] = self.agent_address
        tmp = self.paths.hook_registration + ".tmp"
        with open(tmp, "w") as f:
            yaml.safe_dump(registration, f, sort_keys=False)
        # The proxy watches the directory: a file appears whole or not at all ("*.tmp" is not read).
        os.replace(tmp, self.paths.hook_registration)

    def _save_state(self) -> None:
        state = {
            "pids": [d.pid for d in self.daemons if d.pid] + self._containerd_pid(),
            "containerdSocket": self.containerd.socket_path,
        }
        tmp = self.paths.at(STATE_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.paths.at(STATE_FILE))

    def _containerd_pid(self) -> list[int]:
        proc = getattr(self.containerd, "_proc", None)
        pid = getattr(proc, "pid", 0)
        return [int(pid)] if pid else []

    def stop(self) -> None:
        """Our daemons in reverse order, then containerd with its shims."""
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons.clear()
        self.containerd.cleanup()


def teardown(root: str, *, remove: bool = True) -> None:
    """Stops whatever a run under `root` left running, unmounts, and removes the directory.

    `remove=False` keeps the directory (logs, state) for a person to read.

    Only processes recorded in its state file whose command line names `root`,
    shims serving its containerd socket and the containers those shims run
    are killed; nothing else on the machine is touched.
    """
    if not os.path.isdir(root):
        return
    state: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError), open(os.path.join(root, STATE_FILE)) as f:
        state = json.load(f)
    recorded = {p for p in state.get("pids") or [] if isinstance(p, int) and _cmdline_mentions(p, root)}
    # Also those a signal cut off between starting them and writing the state file.
    for pid in sorted(recorded | _daemons_under(root)):
        _terminate(pid)
    socket = os.path.join(root, "containerd", "containerd.sock")
    shims = _shims_of(socket)
    # Container processes are the shims' children (the shim is their subreaper); a shim's
    # death does not take them along, so they go first.
    containers = _children_of(shims)
    for pid in containers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(containers)
    # The harness's cleanup kills the shims that serve this containerd socket.
    Containerd(base_dir=os.path.join(root, "containerd")).cleanup()
    _unmount_under(root)
    if remove:
        shutil.rmtree(root, ignore_errors=True)


_DAEMONS = {b"containerd", b"fgpu-scheduler", b"fgpu-agent", b"fgpu-runtime-proxy", b"fgpu-descheduler"}


def _daemons_under(root: str) -> set[int]:
    """Our daemons of a run under `root`: one of our programs, with a path under `root` in its arguments."""
    found = set()
    prefix = root.rstrip("/").encode() + b"/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # argv[0] is the interpreter when a console script runs through its shebang.
        programs = {os.path.basename(a) for a in argv[:2]}
        if programs & _DAEMONS and any(prefix in a for a in argv[1:]):
            found.add(int(entry))
    return found


def _cmdline_mentions(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


def _terminate(pid: int, *, grace_s: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _shims_of(socket: str) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and socket.encode() in argv:
            found.add(int(entry))
    return found


def _wait_gone(pids: list[int], *, timeout_s: float = 5.0) -> None:
    """Until each pid has exited (a zombie counts: it holds no resources but its entry)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def _children_of(parents: set[int]) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                ppid = next((int(line.split()[1]) for line in f if line.startswith("PPid:")), 0)
        except (OSError, ValueError):
            continue
        if ppid in parents:
            children.append(int(entry))
    return children


def _unmount_under(root: str) -> None:
    real = os.path.realpath(root)
    with open("/proc/self/mounts") as f:
        targets = [line.split()[1] for line in f]
    for target in sorted((t for t in targets if t == real or t.startswith(real + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
