"""Starts a private containerd (own root, state and socket under a temp dir) with the CRI plugin.

Usable outside pytest: the local demo and `bench/proxy.py` use it too.

    with Containerd() as ctrd:
        ctrd.import_images()
        ... dial ctrd.address (unix:///.../containerd.sock) ...

Sandboxes run in the host network namespace (tests set `NamespaceMode.NODE`)
because there is no CNI here. `restrict_oom_score_adj` lets containerd run
inside a sandbox whose own oom_score_adj is already raised.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

from tests.containerd import images

CONFIG_TEMPLATE = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "{log_level}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{base}/cni/bin"
    conf_dir = "{base}/cni/conf"
"""


class ContainerdError(RuntimeError):
    """containerd could not be started or driven; the message carries its log tail."""


class Containerd:
    """One private containerd process. `start()`, `stop()`, `restart()`; a context manager."""

    def __init__(
        self,
        *,
        base_dir: str | None = None,
        snapshotter: str = "overlayfs",
        log_level: str = "info",
        start_timeout_s: float = 30.0,
    ) -> None:
        self._own_base = base_dir is None
        # unix socket paths are limited to 107 bytes, so keep the base short.
        self.base_dir = base_dir or tempfile.mkdtemp(prefix="fgpu-ctrd-", dir="/tmp")
        self.root = os.path.join(self.base_dir, "root")
        self.state = os.path.join(self.base_dir, "state")
        self.socket_path = os.path.join(self.base_dir, "containerd.sock")
        self.config_path = os.path.join(self.base_dir, "config.toml")
        self.log_path = os.path.join(self.base_dir, "containerd.log")
        self.log_dir = os.path.join(self.base_dir, "logs")
        self.snapshotter = snapshotter
        self.log_level = log_level
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._images_imported = False

    @property
    def address(self) -> str:
        """The CRI endpoint as kubelet would be given it."""
        return f"unix://{self.socket_path}"

    def _write_config(self) -> None:
        for d in (self.root, self.state, self.log_dir, f"{self.base_dir}/cni/bin", f"{self.base_dir}/cni/conf"):
            os.makedirs(d, exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write(
                CONFIG_TEMPLATE.format(
                    root=self.root,
                    state=self.state,
                    socket=self.socket_path,
                    log_level=self.log_level,
                    pause=images.PAUSE.ref,
                    snapshotter=self.snapshotter,
                    base=self.base_dir,
                )
            )

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if shutil.which("containerd") is None:
            raise ContainerdError("containerd is not installed; apt-get install containerd runc")
        self._write_config()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                ["containerd", "--config", self.config_path],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ContainerdError(f"containerd exited with {self._proc.returncode}:\n{self.log_tail()}")
            if os.path.exists(self.socket_path):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    try:
                        s.connect(self.socket_path)
                    except OSError:
                        pass
                    else:
                        if self._cri_ready():
                            return
            time.sleep(0.05)
        raise ContainerdError(f"containerd not ready after {self.start_timeout_s}s:\n{self.log_tail()}")

    def _cri_ready(self) -> bool:
        # The socket answers before the CRI plugin has loaded; `ctr plugins ls` shows when it has.
        out = self.ctr("plugins", "ls", check=False)
        return "io.containerd.grpc.v1" in out and "cri" in out and " ok" in out

    def stop(self, *, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would; shims and containers keep running."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ctr(self, *args: str, check: bool = True, namespace: str = "k8s.io") -> str:
        result = subprocess.run(
            ["ctr", "--address", self.socket_path, "--namespace", namespace, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout + result.stderr

    def import_images(self, specs: tuple[images.ImageSpec, ...] = images.ALL_IMAGES) -> None:
        """Builds the local images and imports them into the k8s.io namespace the CRI plugin uses."""
        if self._images_imported:
            return
        paths = images.write_archives(os.path.join(self.base_dir, "images"), specs)
        for path in paths.values():
            self.ctr("images", "import", "--no-unpack", path)
        self._images_imported = True

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return "(no containerd log)"

    def cleanup(self) -> None:
        """Stops containerd, kills what its shims left running, and removes the temp dir."""
        self.stop()
        self._kill_shims()
        if self._own_base:
            self._unmount_all()
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _kill_shims(self) -> None:
        # Shims outlive containerd by design; ours name this instance's socket in `-address`.
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and self.socket_path.encode() in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(pid), signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)

    def _unmount_all(self) -> None:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f]
        for target in sorted((m for m in mounts if m.startswith(self.base_dir)), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
