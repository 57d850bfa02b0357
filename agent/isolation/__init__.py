"""Isolation backends: what enforces a container's GPU share, one module per backend.

- `hami_core`, `mps`, `none`: the backends; each registers itself (`registry.register_backend`)
  with its name, its `isolationPaths` keys, its `edits` for a container, its readiness `check`
  and its cleanup when a pod stops.
- `registry`: what a backend declares, `IsolationPaths`, and discovery of the backend modules.
- `container`: what one container gets: visibility, the applied backend's edits, FGPU_* env.
- `edits`: `VisibleGPU`, and `BackendEdits`: a backend's answer, the RuntimeHooks protocol's
  `apis.container_edits.ContainerEdits` plus the host directories the agent makes.
- `readiness`: a check's verdict and what it may read (`Files`, `Machine`, `elf_problem`).
- `hami_cache`: HAMi-core's per-container cache directories.

Adding a backend is one module here, e.g. `agent/isolation/dmem.py`::

    LIMIT_DIR = PathKey("dmemLimitDir", "/run/fgpu/dmem", "what it is")

    def edits(gpus, *, paths, pod_uid, container_name) -> BackendEdits:
        return BackendEdits(ContainerEdits(resources=CgroupResources(unified={"dmem.max": ...})))

    def check(paths, *, files, machine) -> BackendStatus: ...

    register_backend("dmem", summary="...", edits=edits, check=check, path_keys=(LIMIT_DIR,))

The agent's config (`isolation:`, `isolationPaths`), `--isolation`'s choices, the backend
check, the hook server's cleanup and `hack/local-up.sh --isolation` then know it; its
documentation goes into docs/isolation.md (docs/architecture.md lists the files).
Wire names it puts in containers (variables) belong in `apis/names.py`.
"""
