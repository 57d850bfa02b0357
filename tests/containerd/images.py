"""Container images built locally from busybox-static, as docker-archive tarballs.

No registry is reachable in CI, so every image the tests run is made here: a
single layer holding `/bin/busybox` and applet symlinks, and an image config
whose `Env`/`Entrypoint` say what each image is for. `ctr images import`
reads the docker-archive format (`manifest.json` + config + layer tars).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field

BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
APPLETS = (
    "sh", "env", "cat", "ls", "sleep", "echo", "test", "grep", "stat", "mount", "true", "false",
    "printenv", "head", "tr", "wc", "id", "ps",
)


@dataclass(frozen=True)
class ImageSpec:
    """One image to build: its reference and the config fields that matter to the tests."""

    ref: str
    env: tuple[str, ...] = ("PATH=/bin",)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ("/bin/sh",)
    labels: dict[str, str] = field(default_factory=dict)


PAUSE = ImageSpec(ref="fgpu.local/pause:1", entrypoint=("/bin/sleep", "2147483647"), cmd=())
BUSYBOX = ImageSpec(ref="fgpu.local/busybox:1")
#: Stands in for a CUDA base image: those bake NVIDIA_VISIBLE_DEVICES=all into their config.
CUDA_LIKE = ImageSpec(ref="fgpu.local/cuda-like:1", env=("PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"))

#: An image whose author baked in every HAMi-core switch that would lift a share's limits. CRI cannot
#: remove image ENV, so only values the hook pins override these.
HOSTILE = ImageSpec(ref="fgpu.local/hostile:1", env=(
    "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "CUDA_DISABLE_CONTROL=true", "CUDA_REDIRECT=/lib/libcuda.so.1",
    "CUDA_DEVICE_MEMORY_LIMIT=999999m", "CUDA_OVERSUBSCRIBE=true", "GPU_CORE_UTILIZATION_POLICY=disable",
    "CUDA_VISIBLE_DEVICES=1,0",
))

ALL_IMAGES = (PAUSE, BUSYBOX, CUDA_LIKE, HOSTILE)


def find_busybox() -> str:
    for path in BUSYBOX_PATHS:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError("busybox not found at /bin/busybox; install the busybox-static package")


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def rootfs_layer(busybox: str | None = None) -> bytes:
    """The one layer every image shares: busybox, its applets, and the usual top-level directories."""
    with open(busybox or find_busybox(), "rb") as f:
        binary = f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "run", "var"):
            _add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
        _add_file(tar, "bin/busybox", binary, 0o755)
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
        _add_file(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        _add_file(tar, "etc/group", b"root:x:0:\n")
    return buf.getvalue()


def image_archive(spec: ImageSpec, layer: bytes) -> bytes:
    """A docker-archive tarball of `spec` over `layer`."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": list(spec.env),
            "Entrypoint": list(spec.entrypoint) or None,
            "Cmd": list(spec.cmd) or None,
            "Labels": spec.labels or None,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "fgpu tests/containerd/images.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [spec.ref], "Layers": [layer_name]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_file(tar, config_name, config_bytes)
        _add_dir(tar, diff_id.removeprefix("sha256:"))
        _add_file(tar, layer_name, layer)
        _add_file(tar, "manifest.json", json.dumps(manifest).encode())
    return buf.getvalue()


def write_archives(directory: str, specs: tuple[ImageSpec, ...] = ALL_IMAGES) -> dict[str, str]:
    """Writes one tarball per image into `directory`; returns ref -> path."""
    os.makedirs(directory, exist_ok=True)
    layer = rootfs_layer()
    paths: dict[str, str] = {}
    for spec in specs:
        path = os.path.join(directory, spec.ref.replace("/", "_").replace(":", "_") + ".tar")
        with open(path, "wb") as f:
            f.write(image_archive(spec, layer))
        paths[spec.ref] = path
    return paths
