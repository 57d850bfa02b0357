"""fgpu-webhook: the admission webhook (AdmissionReview v1 over HTTPS).

Layered as every component (docs/webhook.md for behaviour and deployment):

- decisions, pure functions over the Pod dict: `mutating` (the scheduler name,
  the allocation annotations), `validating` (apis/pod_check.py's verdict, the
  one `fgpuctl validate` prints), `scope` (namespaces, pod selector, opt-out),
  `reading` (the pod's resources read once per shape), `patches` (JSONPatch);
- the framework: `review` (the AdmissionReview envelope), `admission` (routes
  and operations), `errors` (exceptions and their HTTP statuses);
- adapters: `httpserver` (bounded asyncio HTTP/1.1 server), `certs` (the
  serving certificate, reloaded when rotated), `config` (the config file);
- entry point: `app` (assembly), `main` (command line, signals).

It imports apis/ and libraries only, never another component.
"""
