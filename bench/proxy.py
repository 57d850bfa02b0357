"""Benchmark: kubelet -> containerd directly vs through fgpu-runtime-proxy, side by side in one run.

    .venv/bin/python bench/proxy.py            # a readable table
    .venv/bin/python bench/proxy.py --json     # {"version": {...}, "list_containers": {...}, ...}
    .venv/bin/python bench/proxy.py --naive    # also measure a plain grpcio generic-handler proxy

It starts a private containerd (tests/containerd), the proxy as its own
process (`python -m runtimeproxy.main`) and a RuntimeHooks server process
(tests/runtimeproxy/hookserver.py), then measures:

- version: Version, one call at a time;
- list_containers: ListContainers with ~110 pods' containers present;
- create_start: CreateContainer + StartContainer of a GPU pod's container (the
  proxy calls the test hook server, which answers with GPU env vars only;
  directly there is no hook);
- concurrent_qps: Version calls/s with 16 concurrent callers on one channel;
- proxy_cpu_ms_per_call: the proxy process's CPU time (user+sys) per pass-through call;
- hooked_create: CreateContainer of a GPU pod's container against a fake
  runtime that answers at once (no runc), directly vs through a second proxy
  whose GPU hook is the real fgpu-agent (its own process, fake NVML on the
  8-GPU H100 inventory, the shipped hook registration; bench/fgpu_agent_hook.py):
  the pod carries an allocation signed for it, so the agent verifies the
  signature, checks the share against the node and answers with the
  container's GPU env and HAMi-core mounts, which the proxy applies. This
  isolates what the proxy and the agent's hook add from containerd's own
  run-to-run noise. Same fields as the others (direct/proxy p50/p99 in ms).

Direct and proxied samples are taken in alternating blocks so that drift on a
shared machine hits both alike. `--baseline DIR` adds, to hooked_create, a third
proxy from another checkout (e.g. `git worktree add /tmp/old HEAD`) in the same
alternation, with the same agent and fake runtime, and both proxies' CPU per
hooked call (`_baseline` in the result; the readable table prints it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


from fgpu_agent_hook import CONTAINER, AgentHook  # noqa: E402 - bench/ is this script's directory

from apis import names  # noqa: E402
from tests.containerd.harness import Containerd  # noqa: E402
from tests.runtimeproxy.kubelet import RUNTIME, ContainerSpec, Kubelet, Pod, PodSpec  # noqa: E402

ALLOCATION = json.dumps({"gpu": [{"minor": 0, "id": "GPU-bench", "resources": {names.GPU_CORE: "50"}}]})
HOOK_SERVER_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from tests.runtimeproxy.hookserver import HookBehaviour, TestHookServer
TestHookServer(socket_path={sock!r}, behaviour=HookBehaviour(env_only=True)).start()
print("ready", flush=True)
time.sleep(10**6)
"""
FAKE_RUNTIME_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from tests.runtimeproxy.fakeruntime import FakeRuntime
FakeRuntime(socket_path={sock!r}).start()
print("ready", flush=True)
time.sleep(10**6)
"""
NAIVE_PROXY_SCRIPT = """
import sys, time, concurrent.futures, grpc
sys.path.insert(0, {root!r})
from apis.grpc_server import CHANNEL_OPTIONS
backend = grpc.insecure_channel({backend!r}, options=list(CHANNEL_OPTIONS))
class H(grpc.GenericRpcHandler):
    def service(self, details):
        call = backend.unary_unary(details.method)
        def handle(request, context):
            remaining = context.time_remaining()
            try:
                return call(request, timeout=remaining if remaining < 1e6 else None)
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details())
        return grpc.unary_unary_rpc_method_handler(handle)
server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16), options=list(CHANNEL_OPTIONS))
server.add_generic_rpc_handlers((H(),))
server.add_insecure_port({listen!r})
server.start()
print("ready", flush=True)
time.sleep(10**6)
"""


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summary(direct: list[float], proxy: list[float]) -> dict[str, float]:
    return {
        "direct_p50_ms": round(percentile(direct, 0.5) * 1e3, 4),
        "proxy_p50_ms": round(percentile(proxy, 0.5) * 1e3, 4),
        "direct_p99_ms": round(percentile(direct, 0.99) * 1e3, 4),
        "proxy_p99_ms": round(percentile(proxy, 0.99) * 1e3, 4),
    }


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def alternating(fns: list[Callable[[], Any]], *, n: int, block: int) -> list[list[float]]:
    """n samples of each fn, taken in alternating blocks of `block`."""
    results: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        timed(fn, min(block, 50))  # warm up
    done = 0
    while done < n:
        size = min(block, n - done)
        for i, fn in enumerate(fns):
            results[i] += timed(fn, size)
        done += size
    return results


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_process(args: list[str], ready: str | None, log_path: str) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(args, stdout=subprocess.PIPE if ready == "stdout" else log, stderr=log, cwd=ROOT)
    if ready == "stdout":
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if b"ready" not in line:
            raise RuntimeError(f"{args[:3]} did not start; see {log_path}")
    return proc


def start_proxy(listen: str, backend: str, hook_dir: str, log_path: str, *, tree: str = ROOT) -> subprocess.Popen[bytes]:
    """The proxy of the checkout `tree` (this one by default) as its own process."""
    log = open(log_path, "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(proxy_argv(listen, backend, hook_dir), stdout=log, stderr=log, cwd=tree)


def proxy_argv(listen: str, backend: str, hook_dir: str) -> list[str]:
    """fgpu-runtime-proxy as its own process, listening on the socket path `listen`."""
    return [
        sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{listen}", "--backend", backend,
        "--hook-config-dir", hook_dir, "--admin-listen", "", "--metrics-listen", "", "--log-level", "warning",
    ]


def wait_for_socket(path: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.02)


def concurrent_qps(address: str, *, clients: int = 16, seconds: float = 3.0) -> float:
    """Version calls/s with `clients` concurrent callers on one channel, from a separate process."""
    code = f"""
import asyncio, sys, time, grpc
sys.path.insert(0, {ROOT!r})
from apis.grpc_server import parse_address
async def main():
    ch = grpc.aio.insecure_channel(parse_address({address!r}).grpc_target)
    call = ch.unary_unary("{RUNTIME}Version")
    await call(b"\\n\\x02v1")
    count = 0
    stop = time.perf_counter() + {seconds}
    async def worker():
        nonlocal count
        while time.perf_counter() < stop:
            await call(b"\\n\\x02v1")
            count += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range({clients})))
    print(count / (time.perf_counter() - t0))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip())


def create_pods(k: Kubelet, count: int) -> list[Any]:
    def one(i: int) -> Any:
        pod = k.run_pod(PodSpec(name=f"bench-list-{i}"))
        k.create_container(pod, ContainerSpec(name="c", command=["sleep", "1"]))
        return pod

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, range(count)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="fgpu-bench-", dir="/tmp")
    procs: list[subprocess.Popen[bytes]] = []
    agents: list[AgentHook] = []
    ctrd = Containerd()
    try:
        ctrd.start()
        ctrd.import_images()
        hook_sock = os.path.join(base, "hook.sock")
        procs.append(start_process([sys.executable, "-c", HOOK_SERVER_SCRIPT.format(root=ROOT, sock=hook_sock)],
                                   "stdout", os.path.join(base, "hook.log")))
        hook_dir = os.path.join(base, "hooks.d")
        os.makedirs(hook_dir)
        with open(os.path.join(hook_dir, "10-gpu.yaml"), "w") as f:
            f.write(f"hooks:\n  - name: bench-gpu\n    endpoint: unix://{hook_sock}\n"
                    "    stages: [PreCreateContainer]\n    failurePolicy: Ignore\n    timeout: 2s\n")
        listen = os.path.join(base, "proxy.sock")
        proxy = start_process(proxy_argv(listen, ctrd.address, hook_dir), None, os.path.join(base, "proxy.log"))
        procs.append(proxy)
        wait_for_socket(listen)
        targets = {"direct": ctrd.address, "proxy": f"unix://{listen}"}
        if args.naive:
            naive = os.path.join(base, "naive.sock")
            procs.append(start_process(
                [sys.executable, "-c", NAIVE_PROXY_SCRIPT.format(root=ROOT, backend=f"unix://{ctrd.socket_path}",
                                                                 listen=f"unix://{naive}")],
                "stdout", os.path.join(base, "naive.log")))
            targets["naive"] = f"unix://{naive}"
        kubelets = {name: Kubelet(addr, log_root=os.path.join(base, "pods")) for name, addr in targets.items()}
        order = list(targets)
        n = args.calls

        def version_fn(k: Kubelet) -> Callable[[], Any]:
            call = k.channel.unary_unary(RUNTIME + "Version")
            return lambda: call(b"\n\x02v1", timeout=10)

        version = alternating([version_fn(kubelets[t]) for t in order], n=n, block=200)

        pods = create_pods(kubelets["direct"], args.pods)

        def list_fn(k: Kubelet) -> Callable[[], Any]:
            call = k.channel.unary_unary(RUNTIME + "ListContainers")
            return lambda: call(b"", timeout=10)

        listing = alternating([list_fn(kubelets[t]) for t in order], n=max(200, n // 4), block=50)

        gpu_pod = kubelets["direct"].run_pod(PodSpec(name="bench-gpu", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        counter = iter(range(10**6))

        def create_start_fn(k: Kubelet) -> Callable[[], Any]:
            def fn() -> None:
                cid = k.create_container(gpu_pod, ContainerSpec(name=f"c{next(counter)}", command=["true"]))
                k.start_container(cid)
            return fn

        create_start = alternating([create_start_fn(kubelets[t]) for t in order if t != "naive"],
                                   n=args.creates, block=10)

        # proxy CPU per pass-through call
        call = kubelets["proxy"].channel.unary_unary(RUNTIME + "Version")
        cpu0 = cpu_seconds(proxy.pid)
        for _ in range(n):
            call(b"\n\x02v1", timeout=10)
        cpu_per_call_ms = (cpu_seconds(proxy.pid) - cpu0) / n * 1e3

        qps = {t: concurrent_qps(targets[t]) for t in order}

        # the hooked CreateContainer alone, against a runtime that does nothing, with fgpu-agent as the hook
        fake_sock = os.path.join(base, "fake.sock")
        procs.append(start_process([sys.executable, "-c", FAKE_RUNTIME_SCRIPT.format(root=ROOT, sock=fake_sock)],
                                   "stdout", os.path.join(base, "fake.log")))
        agent = AgentHook(os.path.join(base, "agent"))
        agent_pod = PodSpec(name="bench-agent-gpu")
        agent_pod.annotations = agent.pod_annotations(pod_uid=agent_pod.uid)
        agent.start()
        agents.append(agent)
        agent_hooks = os.path.join(base, "agent-hooks.d")
        agent.write_registration(agent_hooks)
        hooked_proxies: list[subprocess.Popen[bytes]] = []
        fake_targets = [f"unix://{fake_sock}"]
        for name, tree in (("proxy-fake", ROOT), *((("baseline-fake", args.baseline),) if args.baseline else ())):
            fake_listen = os.path.join(base, f"{name}.sock")
            hooked_proxies.append(start_proxy(fake_listen, f"unix://{fake_sock}", agent_hooks,
                                              os.path.join(base, f"{name}.log"), tree=tree))
            procs.append(hooked_proxies[-1])
            wait_for_socket(fake_listen)
            fake_targets.append(f"unix://{fake_listen}")
        kd = kubelets["direct"]
        pod = Pod(spec=agent_pod, sandbox_id="bench-agent-sandbox", config=kd.pod_config(agent_pod), log_dir=base)
        payload = kd.create_container_request(pod, ContainerSpec(name=CONTAINER, command=["true"])).SerializeToString()
        fake_calls = [Kubelet(addr).channel.unary_unary(RUNTIME + "CreateContainer") for addr in fake_targets]
        # the proxy refuses a GPU pod's container unless the agent gave it its GPUs: one call shows it did
        for c in fake_calls[1:]:
            c(payload, timeout=10)
        hooked_n = max(500, n // 4)
        hooked_cpu0 = [cpu_seconds(p.pid) for p in hooked_proxies]
        hooked = alternating([lambda c=c: c(payload, timeout=10) for c in fake_calls], n=hooked_n, block=50)
        # per call, the warm-up block included
        hooked_cpu = [
            (cpu_seconds(p.pid) - c0) / (hooked_n + min(50, hooked_n)) * 1e3
            for p, c0 in zip(hooked_proxies, hooked_cpu0, strict=True)
        ]

        result: dict[str, Any] = {
            "version": summary(version[0], version[1]),
            "list_containers": summary(listing[0], listing[1]),
            "create_start": summary(create_start[0], create_start[1]),
            "concurrent_qps": {"direct": round(qps["direct"], 1), "proxy": round(qps["proxy"], 1)},
            "proxy_cpu_ms_per_call": round(cpu_per_call_ms, 4),
        }
        if args.naive:
            result["_naive"] = {
                "version": summary(version[0], version[2]),
                "list_containers": summary(listing[0], listing[2]),
                "concurrent_qps": round(qps["naive"], 1),
            }
        result["hooked_create"] = summary(hooked[0], hooked[1])
        result["_hooked_proxy_cpu_ms_per_call"] = round(hooked_cpu[0], 4)
        if args.baseline:
            result["_baseline"] = {
                "hooked_create": summary(hooked[0], hooked[2]),
                "hooked_proxy_cpu_ms_per_call": round(hooked_cpu[1], 4),
            }
        result["_containers_listed"] = len(kubelets["direct"].list_containers())
        del pods
        return result
    finally:
        for a in agents:
            a.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        ctrd.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--naive", action="store_true", help="also measure a plain grpcio generic-handler proxy")
    parser.add_argument("--calls", type=int, default=2000, help="samples per pass-through measurement")
    parser.add_argument("--pods", type=int, default=110, help="pods (with one container each) present for ListContainers")
    parser.add_argument("--creates", type=int, default=60, help="CreateContainer+StartContainer samples per side")
    parser.add_argument("--baseline", metavar="DIR", help="hooked_create: also run the proxy of this checkout (A/B)")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}))
        return 0
    print(f"containers listed: {result['_containers_listed']}")
    for key in ("version", "list_containers", "create_start"):
        r = result[key]
        print(f"{key:16s} p50 direct {r['direct_p50_ms']:.3f} ms  proxy {r['proxy_p50_ms']:.3f} ms  "
              f"(+{r['proxy_p50_ms'] - r['direct_p50_ms']:.3f})   p99 direct {r['direct_p99_ms']:.3f} ms  "
              f"proxy {r['proxy_p99_ms']:.3f} ms  (+{r['proxy_p99_ms'] - r['direct_p99_ms']:.3f})")
        if "_naive" in result and key in result["_naive"]:
            nv = result["_naive"][key]
            print(f"{'  naive grpcio':16s} p50 {nv['proxy_p50_ms']:.3f} ms  p99 {nv['proxy_p99_ms']:.3f} ms")
    h = result["hooked_create"]
    print(f"hooked_create    p50 direct {h['direct_p50_ms']:.3f} ms  proxy+agent {h['proxy_p50_ms']:.3f} ms  "
          f"(+{h['proxy_p50_ms'] - h['direct_p50_ms']:.3f})   p99 direct {h['direct_p99_ms']:.3f} ms  "
          f"proxy+agent {h['proxy_p99_ms']:.3f} ms  (+{h['proxy_p99_ms'] - h['direct_p99_ms']:.3f})   "
          "[fake runtime, fgpu-agent hook]")
    print(f"  proxy CPU per hooked call: {result['_hooked_proxy_cpu_ms_per_call']:.3f} ms")
    if "_baseline" in result:
        bh = result["_baseline"]["hooked_create"]
        print(f"  baseline proxy+agent p50 {bh['proxy_p50_ms']:.3f} ms (+{bh['proxy_p50_ms'] - bh['direct_p50_ms']:.3f})"
              f"   p99 {bh['proxy_p99_ms']:.3f} ms (+{bh['proxy_p99_ms'] - bh['direct_p99_ms']:.3f})   "
              f"CPU per hooked call {result['_baseline']['hooked_proxy_cpu_ms_per_call']:.3f} ms")
    q = result["concurrent_qps"]
    print(f"concurrent_qps   direct {q['direct']:.0f}/s  proxy {q['proxy']:.0f}/s  ({q['proxy'] / q['direct']:.0%})")
    if "_naive" in result:
        print(f"  naive grpcio   {result['_naive']['concurrent_qps']:.0f}/s")
    print(f"proxy CPU per pass-through call: {result['proxy_cpu_ms_per_call']:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
