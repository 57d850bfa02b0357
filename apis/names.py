"""Every wire name fgpu speaks, defined once.

Resource names, annotation and label keys, env var names and API groups live
here and nowhere else, so the scheduler that writes a name and the agent or
proxy that reads it cannot drift apart. The Koordinator names are the ones of
its open device protocol (`apis/extension/device_share.go`), so pods and
allocations move between fgpu and Koordinator components unchanged.
"""

from typing import Final

# --- Extended resources a pod asks for (Koordinator device protocol) -------

#: Percent of one GPU's compute; 100 per whole GPU, e.g. 50 or 200.
GPU_CORE: Final = "koordinator.sh/gpu-core"
#: GPU memory in bytes (a Kubernetes quantity such as "20Gi").
GPU_MEMORY: Final = "koordinator.sh/gpu-memory"
#: GPU memory as percent of one GPU's memory; 100 per whole GPU.
GPU_MEMORY_RATIO: Final = "koordinator.sh/gpu-memory-ratio"
#: Number of cards a shared request is spread over.
GPU_SHARED: Final = "koordinator.sh/gpu.shared"
#: Koordinator's shorthand for core and memory ratio together, in percent of a card:
#: 100 = one whole GPU, 50 = half of one (compute and memory), 200 = two whole GPUs.
KOORD_GPU: Final = "koordinator.sh/gpu"
#: The NVIDIA device plugin's whole-GPU resource.
NVIDIA_GPU: Final = "nvidia.com/gpu"
#: Prefix of the NVIDIA device plugin's MIG resources ("nvidia.com/mig-1g.10gb", ...).
NVIDIA_MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"

#: Every resource name in the koordinator protocol (what the scheduler manages natively).
KOORDINATOR_RESOURCES: Final = (GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED, KOORD_GPU)

# --- Pod annotations --------------------------------------------------------

#: The allocation the scheduler made: Koordinator's DeviceAllocations JSON,
#: e.g. {"gpu":[{"minor":0,"id":"GPU-...","resources":{"koordinator.sh/gpu-core":"50"}}]}.
DEVICE_ALLOCATED: Final = "scheduling.koordinator.sh/device-allocated"
#: Ed25519 over pod UID + node + DEVICE_ALLOCATED value, "v2:<key id>:<base64url>"
#: (apis/signing.py; "v1:<hex>" HMAC ones only during the upgrade window).
ALLOCATION_SIGNATURE: Final = "fgpu.io/allocation-signature"
#: Node the signed allocation is for (so a node can refuse a foreign one).
ALLOCATION_NODE: Final = "fgpu.io/allocation-node"
#: Key inside a DEVICE_ALLOCATED entry's "extension" object holding the MIG
#: instance UUID of a MIG share. Koordinator decodes "extension" into a struct,
#: so its readers skip this key.
ALLOCATION_MIG_UUID: Final = "fgpu.io/mig-uuid"
#: Allocation entry extension key: which containers of the pod get this GPU, and each one's
#: own share of it, e.g. {"main":{"koordinator.sh/gpu-core":"30",...}}. A container named in
#: no entry gets no GPU. Koordinator skips extension keys it does not know.
ALLOCATION_CONTAINERS: Final = "fgpu.io/containers"
#: Allocation entry extension keys of a MIG instance fgpu creates for the pod: the profile name
#: ("3g.40gb") and the start of its placement in memory slices (4). The node creates exactly that
#: instance before the container starts and destroys it when the pod's sandbox is gone (docs/mig.md).
ALLOCATION_MIG_PROFILE: Final = "fgpu.io/mig-profile"
ALLOCATION_MIG_PLACEMENT: Final = "fgpu.io/mig-placement"
#: Comma-separated GPU models the pod may use (label-safe form, e.g. "A100-SXM4-80GB,H100-SXM5-80GB").
GPU_MODEL_USE: Final = "fgpu.io/gpu-model-use"
#: Comma-separated GPU models the pod must not use.
GPU_MODEL_AVOID: Final = "fgpu.io/gpu-model-avoid"
#: Required topology scope of a multi-GPU pod: "nvlink", "pcie", "numa" or "node".
GPU_TOPOLOGY_SCOPE: Final = "fgpu.io/gpu-topology-scope"
#: Job key override: pods with the same value get the same GPU model.
JOB_KEY: Final = "fgpu.io/job-key"
#: Pod annotation choosing how a single-card share is served: "mig" (a MIG instance only, as HAMi's
#: nvidia.com/vgpu-mode: mig), "shared" (never MIG); absent, either (apis/mig.py has the rule).
GPU_MODE: Final = "fgpu.io/gpu-mode"
#: Node annotation prefix of a requested MIG mode change, one key per GPU: `fgpu.io/mig-mode.<GPU UUID>`
#: = MIG_MODE_ENABLED | MIG_MODE_DISABLED. Written by `fgpuctl mig enable|disable` after its drain check;
#: the node's agent switches the GPU once it is idle and removes the key (docs/mig.md, "Mode changes").
MIG_MODE_REQUEST_PREFIX: Final = "fgpu.io/mig-mode."
MIG_MODE_ENABLED: Final = "enabled"
MIG_MODE_DISABLED: Final = "disabled"
#: Node annotation prefix of the agent's answer to a MIG mode request, one key per GPU:
#: `fgpu.io/mig-mode-status.<GPU UUID>` = the JSON of `apis.mig_mode.ModeStatus` (state, mode, message).
#: The agent writes it on every change of the answer; fgpuctl mig clears it with a new request.
MIG_MODE_STATUS_PREFIX: Final = "fgpu.io/mig-mode-status."
#: Reasons of the agent's Events on its Node about a MIG mode request (docs/mig.md).
EVENT_MIG_MODE_CHANGED: Final = "MIGModeChanged"
EVENT_MIG_MODE_WAITING: Final = "MIGModeWaiting"
EVENT_MIG_MODE_RESET_PENDING: Final = "MIGModeResetPending"
EVENT_MIG_MODE_FAILED: Final = "MIGModeFailed"

#: Burstable GPU shares (apis/overcommit.py, docs/overcommit.md). Kubernetes refuses request != limit on
#: extended resources, so the tier and its limits are annotations: `fgpu.io/gpu-qos: burstable` with
#: `fgpu.io/gpu-core-limit: "80"` and `fgpu.io/gpu-memory-limit: "20Gi"` (or `fgpu.io/gpu-memory-ratio-limit:
#: "60"` beside a ratio request). The request is reserved; the limit is what the isolation backend enforces.
GPU_QOS: Final = "fgpu.io/gpu-qos"
GPU_QOS_GUARANTEED: Final = "guaranteed"
GPU_QOS_BURSTABLE: Final = "burstable"
GPU_CORE_LIMIT: Final = "fgpu.io/gpu-core-limit"
GPU_MEMORY_LIMIT: Final = "fgpu.io/gpu-memory-limit"
GPU_MEMORY_RATIO_LIMIT: Final = "fgpu.io/gpu-memory-ratio-limit"
#: Allocation entry extension key of a burstable share: its signed limits, e.g.
#: {"koordinator.sh/gpu-core":"80","koordinator.sh/gpu-memory":"20Gi","koordinator.sh/gpu-memory-ratio":"25"}.
#: Present only on burstable shares: its presence is the tier.
ALLOCATION_BURST_LIMIT: Final = "fgpu.io/burstable-limit"
#: Node label: the node pool's burstable overcommit ratio ("1.5"); absent, the node takes no burstable share.
NODE_BURSTABLE_RATIO: Final = "fgpu.io/burstable-ratio"
#: Event reason and metric of the agent's reclaim (agent/reclaim_loop.py).
EVENT_BURSTABLE_EVICTED: Final = "BurstableEvicted"
AGENT_NAME: Final = "fgpu-agent"
METRIC_RECLAIM_EVICTIONS: Final = "fgpu_agent_reclaim_evictions_total"

# --- Labels -------------------------------------------------------------------

#: Gang/pod-group label (scheduler-plugins coscheduling), one of the job keys.
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
#: Older pod-group label still used by some operators.
POD_GROUP_LABEL_LEGACY: Final = "pod-group.scheduling.sigs.k8s.io"
#: Label JobSet puts on every pod of its child Jobs: the JobSet's name, one of the job keys.
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
#: Node field a required node affinity term may match (matchFields), e.g. for DaemonSet pods.
NODE_NAME_FIELD: Final = "metadata.name"
#: Node label: GPU model (label-safe form).
NODE_GPU_MODEL: Final = "node.koordinator.sh/gpu-model"
#: Node label: GPU vendor.
NODE_GPU_VENDOR: Final = "node.koordinator.sh/gpu-vendor"
#: Node label: driver version.
NODE_GPU_DRIVER_VERSION: Final = "node.koordinator.sh/gpu-driver-version"
#: Pod label marking a RuntimeHooks server pod: the proxy bypasses hooks for it,
#: so an agent running as a pod cannot deadlock its own creation.
HOOK_SERVER_LABEL: Final = "fgpu.io/hook-server"
#: Pod label opting a pod out of fgpu-webhook's scheduler injection: with the value "false", a GPU pod
#: that names no scheduler keeps kube-scheduler (e.g. for another GPU product's device plugin).
SCHEDULER_INJECTION_LABEL: Final = "fgpu.io/inject-scheduler"
SCHEDULER_INJECTION_OPT_OUT: Final = "false"

# --- Node taints Kubernetes itself sets (kube-scheduler and the node lifecycle controller) ---

#: Taint kube-scheduler reads spec.unschedulable (cordon) as; a pod tolerating it may still land.
TAINT_UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"
#: Taint the node lifecycle controller sets while condition Ready is False.
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
#: Taint the node lifecycle controller sets while condition Ready is Unknown (kubelet silent).
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
#: Taint the node lifecycle controller sets while condition NetworkUnavailable is True.
TAINT_NETWORK_UNAVAILABLE: Final = "node.kubernetes.io/network-unavailable"

# --- Scheduler ---------------------------------------------------------------

#: schedulerName of pods the standalone scheduler binds itself.
SCHEDULER_NAME: Final = "fgpu-scheduler"
#: The schedulerName the API server defaults an empty one to: a pod that names no scheduler.
DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"
#: Lease used for leader election of the standalone scheduler.
LEADER_LEASE_NAME: Final = "fgpu-scheduler"
#: Secret (in the fgpu namespace) with the scheduler's Ed25519 private key, mounted in the scheduler only.
SIGNING_KEY_SECRET: Final = "fgpu-scheduler-signing-key"
#: Its data key: the file the scheduler's `signingKey` names.
SIGNING_KEY_FILE: Final = "signing-key.pem"
#: ConfigMap with the public keys allocation signatures are verified with, one data key per key.
VERIFYING_KEYS_CONFIGMAP: Final = "fgpu-verifying-keys"
#: Secret with the v1 HMAC cluster key of fgpu before v2 signatures; kept only for the upgrade window.
LEGACY_SIGNING_KEY_SECRET: Final = "fgpu-signing-key"
#: Prefix of a node's name in its client certificate (kubelet's convention, O=system:nodes): over TLS
#: the scheduler takes a ReportDevices only from a certificate naming that node (this prefix + node, or the node).
NODE_IDENTITY_PREFIX: Final = "system:node:"

# --- Admission webhook (fgpu-webhook) -------------------------------------------

#: HTTPS paths of the webhook's AdmissionReview v1 endpoints, named in the webhook configurations.
WEBHOOK_MUTATE_PATH: Final = "/mutate"
WEBHOOK_VALIDATE_PATH: Final = "/validate"

# --- The Device custom resource (Koordinator scheduling.koordinator.sh/v1alpha1) ---

DEVICE_GROUP: Final = "scheduling.koordinator.sh"
DEVICE_VERSION: Final = "v1alpha1"
DEVICE_PLURAL: Final = "devices"
DEVICE_KIND: Final = "Device"
DEVICE_TYPE_GPU: Final = "gpu"
#: Annotation on the Device holding fgpu's extra facts (NVLink peers, MIG
#: instances, external holders, driver versions) as JSON. Koordinator's readers
#: ignore annotations, and its CRD schema would prune unknown spec fields.
DEVICE_EXTRAS: Final = "fgpu.io/device-extras"

# --- Kubernetes CRI ------------------------------------------------------------------

#: gRPC services of the Container Runtime Interface that fgpu-runtime-proxy serves.
CRI_RUNTIME_SERVICE: Final = "runtime.v1.RuntimeService"
CRI_IMAGE_SERVICE: Final = "runtime.v1.ImageService"

# --- Container environment ------------------------------------------------------

NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
#: Value that makes the NVIDIA container runtime expose no GPU.
NVIDIA_VISIBLE_DEVICES_VOID: Final = "void"
#: CUDA's device enumeration order; the agent sets "PCI_BUS_ID" so that CUDA
#: ordinal i is the i-th visible GPU by bus id, the index the per-GPU limit
#: variables (CUDA_DEVICE_MEMORY_LIMIT_<i>, the MPS "<i>=" list) use.
CUDA_DEVICE_ORDER: Final = "CUDA_DEVICE_ORDER"
CUDA_DEVICE_ORDER_PCI_BUS_ID: Final = "PCI_BUS_ID"
#: HAMi-core: per visible GPU i, "CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m".
HAMI_MEMORY_LIMIT_PREFIX: Final = "CUDA_DEVICE_MEMORY_LIMIT_"
#: HAMi-core: compute limit in percent.
HAMI_SM_LIMIT: Final = "CUDA_DEVICE_SM_LIMIT"
#: HAMi-core: per-container shared cache file.
HAMI_SHARED_CACHE: Final = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
#: HAMi-core: memory limit for every device without its own CUDA_DEVICE_MEMORY_LIMIT_<i>.
HAMI_MEMORY_LIMIT: Final = "CUDA_DEVICE_MEMORY_LIMIT"
#: HAMi-core's off switch ("true" turns isolation off); the hook pins it to "false".
HAMI_DISABLE_CONTROL: Final = "CUDA_DISABLE_CONTROL"
#: HAMi-core: "true" lets device memory spill past the limit; pinned to "false".
HAMI_OVERSUBSCRIBE: Final = "CUDA_OVERSUBSCRIBE"
#: HAMi-core: the library CUDA symbols are looked up in; pinned to libvgpu.so itself.
HAMI_REDIRECT: Final = "CUDA_REDIRECT"
#: HAMi-core: "disable" ignores the compute limit; pinned to "default".
HAMI_CORE_POLICY: Final = "GPU_CORE_UTILIZATION_POLICY"
#: Name prefixes of every variable HAMi-core or the MPS client reads, for removing the pod's own.
ISOLATION_ENV_PREFIXES: Final = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_")
#: CUDA's own device filter; limits are indexed by CUDA ordinal, so a share pins it to 0..n-1.
CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
#: Node condition the agent sets: whether the node's isolation backend can enforce GPU shares.
ISOLATION_READY_CONDITION: Final = "FgpuIsolationReady"
#: NVIDIA MPS: pipe directory of the MPS control daemon.
MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
#: NVIDIA MPS: log directory.
MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"
#: NVIDIA MPS: "<i>=<MiB>M,..." memory limit per device.
MPS_PINNED_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
#: NVIDIA MPS: compute limit in percent.
MPS_ACTIVE_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: Informative: comma-separated allocated memory bytes per visible GPU.
FGPU_MEMORY_BYTES: Final = "FGPU_GPU_MEMORY_BYTES"
#: Informative: comma-separated allocated core percent per visible GPU.
FGPU_CORE_PERCENT: Final = "FGPU_GPU_CORE_PERCENT"
#: Informative: comma-separated GPU UUIDs, same order as the two above.
FGPU_GPU_UUIDS: Final = "FGPU_GPU_UUIDS"
#: Informative: the isolation backend that enforces the limits.
FGPU_ISOLATION: Final = "FGPU_ISOLATION"
#: Downward-API variable carrying the node name to the agent.
NODE_NAME_ENV: Final = "NODE_NAME"

# --- Defragmentation (fgpu-descheduler, docs/defrag.md) ---------------------------------

#: Opt-in, as a label on the pod or on its namespace: `fgpu.io/defrag: allow` lets the descheduler
#: evict the pod to make room for a pending GPU pod (only if its owner recreates it). The pod's own
#: label decides; the namespace's is the default for pods without one.
DEFRAG_OPT_IN_LABEL: Final = "fgpu.io/defrag"
DEFRAG_OPT_IN_VALUE: Final = "allow"
#: The descheduler's name in Events (`reportingComponent` / `source.component`).
DESCHEDULER_NAME: Final = "fgpu-descheduler"
#: Event reasons: on a moved pod (naming the pod it made room for), a dry-run plan, a stopped step.
EVENT_DEFRAG_EVICTED: Final = "DefragEvicted"
EVENT_DEFRAG_WOULD_EVICT: Final = "DefragWouldEvict"
EVENT_DEFRAG_ABORTED: Final = "DefragAborted"
#: ConfigMap (in the descheduler's own namespace) that records why the evictor stopped, so a restart
#: stays stopped: data {"reason": ..., "since": RFC 3339}. Delete it and restart the descheduler to resume.
DESCHEDULER_STOP_CONFIGMAP: Final = "fgpu-descheduler-stopped"
DESCHEDULER_STOP_REASON_KEY: Final = "reason"
DESCHEDULER_STOP_SINCE_KEY: Final = "since"
#: Env var naming the descheduler's own namespace (the Deployment sets it from the downward API).
DESCHEDULER_NAMESPACE_ENV: Final = "FGPU_DESCHEDULER_NAMESPACE"
#: Prometheus metrics of the descheduler.
METRIC_DEFRAG_MOVES: Final = "fgpu_defrag_moves_total"
#: Pending pods room was made for, and the GPU-seconds they had waited by then (GPUs x wait): the
#: waiting a move ended, not a counterfactual (the churn replay measures GPU-hours recovered).
METRIC_DEFRAG_MADE_ROOM: Final = "fgpu_defrag_made_room_total"
METRIC_DEFRAG_WAITED_GPU_SECONDS: Final = "fgpu_defrag_made_room_waited_gpu_seconds_total"
#: Nodes the consolidation mode emptied of GPU pods.
METRIC_DEFRAG_NODES_EMPTIED: Final = "fgpu_defrag_nodes_emptied_total"
METRIC_DEFRAG_ABORTED: Final = "fgpu_defrag_aborted_total"


# --- What a pod author writes -----------------------------------------------------

#: Every name above that a pod author may write on a GPU pod (resources, annotations, labels, the
#: scheduler name). docs/requesting-gpus.md documents each one; tests/pod_guide keeps its reference
#: table and this tuple equal. Other products' resources come from the translation rules, not here.
POD_FACING: Final = (
    GPU_CORE,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    GPU_SHARED,
    KOORD_GPU,
    NVIDIA_GPU,
    GPU_MODEL_USE,
    GPU_MODEL_AVOID,
    GPU_TOPOLOGY_SCOPE,
    GPU_MODE,
    GPU_QOS,
    GPU_CORE_LIMIT,
    GPU_MEMORY_LIMIT,
    GPU_MEMORY_RATIO_LIMIT,
    JOB_KEY,
    POD_GROUP_LABEL,
    POD_GROUP_LABEL_LEGACY,
    JOBSET_NAME_LABEL,
    SCHEDULER_INJECTION_LABEL,
    DEFRAG_OPT_IN_LABEL,
    SCHEDULER_NAME,
)
#: What a GPU container finds in its environment (set by the agent's hook; informative, read-only).
POD_VISIBLE_ENV: Final = (FGPU_GPU_UUIDS, FGPU_MEMORY_BYTES, FGPU_CORE_PERCENT, FGPU_ISOLATION)

# --- Isolation backends (agent) ---------------------------------------------------

#: The agent's built-in isolation backends, as `isolation:` in its config, `--isolation`, the chart's
#: `agent.pools[].isolation` and `FGPU_ISOLATION` in a container spell them (agent/isolation/).
ISOLATION_HAMI_CORE: Final = "hami-core"
ISOLATION_MPS: Final = "mps"
#: Visibility only; also what a container gets when none of its GPUs needs a software limit.
ISOLATION_NONE: Final = "none"
#: Name prefix of every variable the MPS client reads.
MPS_ENV_PREFIX: Final = "CUDA_MPS_"

# --- Test doubles --------------------------------------------------------------------------------

#: Environment variable naming a YAML usage file the fake NVML (agent/fakenvml_usage.py) follows while
#: it runs, so a script outside the agent process can change what NVML reports (hack/localup's
#: overcommit demo). Never read by the real NVML path.
FAKE_NVML_USAGE_ENV: Final = "FGPU_FAKE_NVML_USAGE"

#: "1": install the runtime proxy's relay as pure Python (setup.py), or run it so where it was compiled
#: (runtimeproxy.compiled); for comparison and tests, the compiled relay is the same code
PURE_PYTHON_ENV: Final = "FGPU_PURE_PYTHON"

# --- Agent metrics other components read (fgpuctl top) --------------------------------------------

#: Per GPU: its memory in bytes (labels: uuid).
AGENT_METRIC_GPU_MEMORY_TOTAL: Final = "fgpu_agent_gpu_memory_total_bytes"
#: Per GPU: SM utilization over NVML's last sample, percent (labels: uuid).
AGENT_METRIC_GPU_SM_UTILIZATION: Final = "fgpu_agent_gpu_sm_utilization_percent"
#: Per pod and GPU: memory used by the pod's processes, bytes (labels: pod_uid, uuid).
AGENT_METRIC_POD_GPU_MEMORY_USED: Final = "fgpu_agent_pod_gpu_memory_used_bytes"
#: Per pod and GPU: how many of the pod's processes run there (labels: pod_uid, uuid).
AGENT_METRIC_POD_GPU_PROCESSES: Final = "fgpu_agent_pod_gpu_processes"
