"""A Kubernetes API server test double, in-process, over real HTTP.

Why it exists: no kube-apiserver can be installed on the machines fgpu is
built and tested on, yet the agent and the scheduler must be tested through
the official `kubernetes` client exactly as they run in production. This
double speaks enough of the real protocol that production code, given only
the kubeconfig it writes, cannot tell it apart for the calls fgpu makes. It
is a test double, not a product feature, hence it lives under `tests/`.

What it speaks: core/v1 pods (with `status` and `binding`), nodes (with
`status`), namespaces, configmaps, events; events.k8s.io/v1 events;
coordination.k8s.io/v1 leases; apiextensions.k8s.io/v1 CRDs and the custom
resources they define (pruned and validated against their schema);
discovery. Verbs get, list (with pagination), create, update, delete (and
deletecollection), patch (merge, strategic merge, JSON patch), watch (with
resume, 410 after compaction, bookmarks, selectors, timeouts). Errors are
real `Status` bodies. Fault injection: failing or hanging the next calls,
pausing, dropping watches, restarting with or without state.
Known gaps: no server-side apply (415), no admission beyond the strategies in
`strategies.py`, no version conversion between CRD versions. Graceful pod
deletion (`deletion.py`) is opt-in, `KubeAPIServer(graceful_pod_deletion=True)`,
since there is no kubelet: a test confirms with `kubelet_confirm_deletion`;
by default a pod without finalizers goes at once.

Own implementation rather than kmock: kmock's `KubernetesEmulator` (kmock
0.8, installed) was weighed first. It is asyncio-only (tests here are
synchronous and would need a loop thread anyway), and everything this issue
asks beyond its "simplistic" emulator lives in the part one would override:
its `_handle` mutates state with naive dict merges under its own lock before
any subclass hook, lists report resourceVersion `...`, it has no history, no
410, no optimistic concurrency and no subresources. Extending it would mean
replacing its storage, patching, watch and list paths while depending on its
private `_internal` modules, keeping only its routing. So the double owns its
semantics (store, patching, watch) and takes the plumbing from maintained
libraries: the standard library's `http.server` (threaded, HTTP/1.1 chunked
streaming) for HTTP, `jsonpatch` for RFC 6902 and PyYAML for manifests.

Layout: `store.py` (objects, resourceVersion, history), `strategies.py`
(per-kind create/update rules), `patching.py`, `schema.py` (CRD pruning and
validation), `selectors.py`, `watching.py`, `routing.py`, `discovery.py`,
`deletion.py`, `handler.py` (HTTP), `faults.py`, `server.py` (`KubeAPIServer`),
`fixture.py` (the `kube_api` pytest fixture).
"""

from tests.kubeapi.server import DEVICE_CRD, KubeAPIServer

__all__ = ["DEVICE_CRD", "KubeAPIServer"]
