"""fgpu runtime proxy: a CRI gRPC proxy between kubelet and containerd that applies GPU hooks.

The daemon: `main` (flags, signals) starts `server` (listener, admin socket,
metrics, start/stop), which wires the relay to `interception` (the
`calls.CallHandler` that runs the hooks of intercepted CRI calls).

The intercepted calls, one `call_specs.CallSpec` per CRI method, are in
`cri_calls`: its path and request type, its hook stage, how to find its pod,
how to build the hook request and apply the answer (a codec pair in `crimsg`).
The stages are the methods of the RuntimeHooks service, read from its
descriptor (`stages`); hook servers register for them (`hookconfig`) and are
called by `hookclient`, over one HTTP/2 connection per server that the proxy
drives itself from its event loop with the relay's codecs (`hook_connection`). `verdicts` folds the hooks' outcomes into what happens
to the call, `edits` merges their answers; `runtime_client` asks the runtime
about a call's pod; `backend_health` whether the runtime can be reached (the admin socket's health); `metrics`, `logs`, `errors`, `config`.

Words: a hook *rejects* a call (`HookResponse.rejection`, "rejected" in
metrics and messages); the proxy *refuses* one when it answers kubelet itself
instead of forwarding (`calls.Refuse`, `Judgement.refusal`, `refusal`,
`fgpu_runtime_proxy_refused_total`): after a hook's rejection, a failed hook, a
GPU pod without its settings, no runtime, or while draining.

The relay moves HTTP/2 frames between kubelet and the runtime (how and why:
`relay`'s docstring, docs/runtime-proxy.md). Its modules import one way, top
to bottom (an import-linter `layers` contract in pyproject.toml keeps it so):

- `relay`: the listener; accepts kubelet connections, and drains them on shutdown.
- `connection`: one kubelet connection and its runtime connection; dialling,
  either side going away.
- `request_pump` (kubelet -> runtime), `response_pump` (runtime -> kubelet):
  cut a direction's bytes into frames, check them, forward runs of them
  unchanged, and hand the rest to the modules below.
- `held_calls`: intercepted calls; the held request goes to the handler, the
  answer to the runtime (compressed again if kubelet compressed it) or to kubelet.
- `refusal`: no runtime; answers kubelet as a tiny server that fails every call.
- `draining`: graceful shutdown of one connection (GOAWAY, PING, GOAWAY, close).
- `peer_errors`: a peer broke HTTP/2 or went away; GOAWAY or RST_STREAM with
  the RFC's code, kubelet's open calls ended with a status, one log line.
- `flow_control`: the runtime's windows for what the relay sends itself,
  queued DATA, credit withheld from kubelet, SETTINGS applied after their ACK.
- `header_sync`: both peers' HPACK tables kept in step when a header block is
  dropped (re-encoding that direction from then on) or written by the relay.
- `relay_state`: the state core; per-connection and per-stream records and
  their teardown, and the transports the pumps write through (one write per
  peer per pass, `CorkedTransport`). It imports none of the above, only the
  leaf codecs.
- `grpc_framing`: gRPC status codes, message framing and compression, the
  relay's own trailers (capped, split into CONTINUATIONs).
- `calls`, `h2frames`, `hpack_codec`: leaf codecs that import nothing of the
  package; the handler seam, HTTP/2 frames and their RFC 9113 checks, HPACK.
"""

from runtimeproxy import compiled as _compiled

_compiled.prefer_fresh(__name__)
