"""The `fgpu.v1.Scheduler` gRPC service: a thin servicer over `SchedulingService`.

Each method turns the request into a pod dict and a domain call; one
interceptor turns domain exceptions into gRPC status codes (through
`errors.grpc_code`), so no method picks a code itself. The server serves
health and reflection (apis.grpc_server), so
`grpcurl -plaintext -unix SOCK fgpu.v1.Scheduler/GetNodeState` works by hand.

What a caller can get, and from whom (docs/scheduler.md, "Who may call"):
- Reserve and Bind answer with the GPUs chosen, never the signed annotation:
  the signature leaves the scheduler only on the pod itself, written at bind.
- With the kubernetes backend, Reserve and Bind decide on the pod as the API
  has it (read by name, UID checked), not on the pod in the request; and
  ReportDevices is refused, since a node's GPUs come only from its Device
  object, which only its own agent may write.
- The listener is a unix socket or loopback, or else mutual TLS
  (`grpcTLS`): a client certificate signed by the configured CA. Over TLS the
  certificate's names decide what it may call (`caller_roles`, shared with
  the extender): a report only for the node it names, and Reserve, Bind and
  Unreserve never by a node's identity.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from apis import grpc_server, tls
from apis.allocation import Allocation
from apis.devices import NodeDevices, from_proto, to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin import caller_roles, errors, pods, trusted_pod
from scheduler_plugin.errors import InvalidRequest, Refused
from scheduler_plugin.scheduling import SchedulingService, SignedAllocation

log = logging.getLogger(__name__)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


def pod_from_proto(pod: scheduler_pb2.Pod) -> dict[str, Any]:
    """The pod dict for a `fgpu.v1.Pod`: its manifest when given, else built from the fields."""
    if pod.manifest_json:
        try:
            obj = json.loads(pod.manifest_json)
        except ValueError as exc:
            raise InvalidRequest(f"pod.manifest_json: not valid JSON ({exc}); send the Pod object as the API returns it") from exc
        if not isinstance(obj, dict):
            raise InvalidRequest(f"pod.manifest_json: expected a JSON object (a Pod), got {type(obj).__name__}")
        return obj
    if not pod.name and not pod.uid:
        raise InvalidRequest("pod: give manifest_json, or at least name, uid and containers")
    return pods.from_proto_fields(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        containers=[(c.name, dict(c.requests), dict(c.limits), c.init) for c in pod.containers],
    )


def allocation_to_proto(signed: SignedAllocation) -> scheduler_pb2.NodeAllocation:
    """The GPUs chosen; deliberately not `signed.annotations` (see the module docstring)."""
    return scheduler_pb2.NodeAllocation(node_name=signed.node, gpus=_gpus(signed.allocation))


def _gpus(allocation: Allocation) -> list[scheduler_pb2.GPUAllocation]:
    return [
        scheduler_pb2.GPUAllocation(
            minor=g.minor,
            uuid=g.uuid,
            core_percent=g.core_percent,
            memory_bytes=g.memory_bytes,
            memory_ratio_percent=g.memory_ratio_percent,
            mig_uuid=g.mig_uuid,
        )
        for g in allocation.gpus
    ]


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self, service: SchedulingService, *, pods_from_api: bool, accept_reports: bool, reports_by_certificate: bool = False
    ) -> None:
        """`pods_from_api`: Reserve/Bind read the pod from the API (kubernetes backend);
        `accept_reports`: ReportDevices sets a node's GPUs (embedded backend only);
        `reports_by_certificate` (mutual TLS): the client certificate's names decide what it may call
        (caller_roles)."""
        self._service = service
        self._pods_from_api = pods_from_api
        self._accept_reports = accept_reports
        self._reports_by_certificate = reports_by_certificate

    def _check(self, context: grpc.ServicerContext, verb: caller_roles.Verb, call: str, *, node: str = "") -> None:
        """Over mutual TLS, the caller-role rule (caller_roles) for the client's certificate."""
        if not self._reports_by_certificate:
            return
        caller_roles.check(
            cert_names=certificate_names(context),
            verb=verb,
            call=call,
            node=node,
            known_among=lambda wanted: [v.name for v in self._service.node_views(wanted)],
        )

    def _pod_to_place(self, message: scheduler_pb2.Pod) -> dict[str, Any]:
        """The pod that Reserve/Bind choose and sign GPUs for."""
        pod = pod_from_proto(message)
        if not self._pods_from_api:
            return pod  # embedded: the caller's pod is the only record there is
        meta = pod.get("metadata") or {}
        return trusted_pod.from_api(
            self._service,
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
        )

    def Filter(self, request: scheduler_pb2.FilterRequest, context: grpc.ServicerContext) -> scheduler_pb2.FilterResponse:
        outcome = self._service.filter(pod_from_proto(request.pod), list(request.node_names) or None)
        return scheduler_pb2.FilterResponse(
            verdicts=[
                scheduler_pb2.NodeVerdict(
                    node_name=v.node_name, feasible=v.feasible, reason=v.reason, unresolvable=v.unresolvable
                )
                for v in outcome.verdicts
            ],
            pod_error=outcome.pod_error,
        )

    def Score(self, request: scheduler_pb2.ScoreRequest, context: grpc.ServicerContext) -> scheduler_pb2.ScoreResponse:
        scores = self._service.score(pod_from_proto(request.pod), list(request.node_names))
        return scheduler_pb2.ScoreResponse(scores=[scheduler_pb2.NodeScore(node_name=n, score=s) for n, s in scores])

    def Reserve(self, request: scheduler_pb2.ReserveRequest, context: grpc.ServicerContext) -> scheduler_pb2.ReserveResponse:
        self._check(context, caller_roles.Verb.SCHEDULE, "Reserve")
        _require(request.node_name, "node_name")
        signed = self._service.reserve(self._pod_to_place(request.pod), request.node_name)
        return scheduler_pb2.ReserveResponse(allocation=allocation_to_proto(signed))

    def Unreserve(
        self, request: scheduler_pb2.UnreserveRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.UnreserveResponse:
        self._check(context, caller_roles.Verb.SCHEDULE, "Unreserve")
        self._service.unreserve(pod_from_proto(request.pod))
        return scheduler_pb2.UnreserveResponse()

    def Bind(self, request: scheduler_pb2.BindRequest, context: grpc.ServicerContext) -> scheduler_pb2.BindResponse:
        self._check(context, caller_roles.Verb.SCHEDULE, "Bind")
        _require(request.node_name, "node_name")
        signed = self._service.bind(self._pod_to_place(request.pod), request.node_name)
        return scheduler_pb2.BindResponse(allocation=allocation_to_proto(signed))

    def ReportDevices(
        self, request: scheduler_pb2.ReportDevicesRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ReportDevicesResponse:
        if not self._accept_reports:
            raise Refused(
                "ReportDevices: refused, this scheduler runs with the kubernetes state backend, where a node's "
                "GPUs come only from its Device object (written by that node's fgpu-agent); drop --scheduler "
                "from the agent, or run the scheduler with --state embedded"
            )
        _require(request.report.node_name, "report.node_name")
        self._check(context, caller_roles.Verb.REPORT, "ReportDevices", node=request.report.node_name)
        orphans = self._service.report_devices(from_proto(request.report))
        return scheduler_pb2.ReportDevicesResponse(orphaned_allocations=orphans)

    def GetNodeState(
        self, request: scheduler_pb2.GetNodeStateRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.GetNodeStateResponse:
        views = self._service.node_views(list(request.node_names) or None)
        out = []
        for view in sorted(views, key=lambda v: v.name):
            report = to_proto(NodeDevices(node_name=view.name, gpus=tuple(g.device for g in view.gpus)))
            gpus = [
                scheduler_pb2.GPUState(
                    device=proto_gpu,
                    allocated_core_percent=g.allocated_core_percent,
                    allocated_memory_bytes=g.allocated_memory_bytes,
                    pods=[
                        scheduler_pb2.PodShare(
                            namespace=p.namespace,
                            name=p.name,
                            uid=p.uid,
                            core_percent=p.core_percent,
                            memory_bytes=p.memory_bytes,
                            assumed=p.assumed,
                        )
                        for p in g.pods
                    ],
                    held_externally=g.held_externally,
                )
                for g, proto_gpu in zip(view.gpus, report.gpus, strict=True)
            ]
            out.append(
                scheduler_pb2.NodeState(
                    node_name=view.name, gpus=gpus, driver_version=view.driver_version, discovery_error=view.discovery_error
                )
            )
        return scheduler_pb2.GetNodeStateResponse(nodes=out)


def certificate_names(context: grpc.ServicerContext) -> tuple[str, ...]:
    """The names the client's verified certificate carries: its common name and subject alternative names."""
    auth = context.auth_context()
    found: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for raw in auth.get(key, ()):
            found.append(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
    return tuple(found)


def _require(value: str, field: str) -> None:
    if not value:
        raise InvalidRequest(f"{field}: required; give the node name the pod is for")


class ErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Maps exceptions raised by servicer methods to gRPC status codes, in one place."""

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = details.method

        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return inner(request, context)
            except Exception as exc:
                code = errors.grpc_code(exc)
                if code is grpc.StatusCode.INTERNAL:
                    log.exception("%s failed", method)
                context.abort(code, errors.describe(exc))

        return grpc.unary_unary_rpc_method_handler(
            wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


class GrpcServer:
    """The gRPC server: Scheduler + health + reflection on one address, with mutual TLS when given."""

    def __init__(
        self,
        service: SchedulingService,
        *,
        address: str,
        pods_from_api: bool,
        accept_reports: bool,
        tls_files: tls.TLSFiles = tls.TLSFiles(),
        workers: int = 8,
    ) -> None:
        field = "--grpc-listen"
        try:
            # Checked again here, not only in the config: no path may open a plaintext port to the network.
            tls.check_listener(address, tls_files, field=field, tls_key="grpcTLS")
            tls.check_complete(tls_files, field="grpcTLS", keys=("certFile", "keyFile", "clientCAFile"))
        except tls.TLSError as exc:
            raise InvalidRequest(str(exc)) from None
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fgpu-sched-grpc"),
            interceptors=[ErrorInterceptor()],
            options=list(grpc_server.CHANNEL_OPTIONS),
        )
        servicer = SchedulerServicer(
            service, pods_from_api=pods_from_api, accept_reports=accept_reports, reports_by_certificate=tls_files.enabled
        )
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]
        self.health = grpc_server.add_health_and_reflection(self._server, [SERVICE_NAME])
        self.address = grpc_server.parse_address(address, field=field)
        #: the TCP port bound (useful with port 0); 0 for a unix socket
        self.port = 0
        if tls_files.enabled:
            self.port = tls.add_secure_listener(self._server, address, tls_files, field=field)
        else:
            grpc_server.add_listener(self._server, address, field=field)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None = None) -> None:
        self.health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
