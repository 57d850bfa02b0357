"""Benchmark: external HTTP/2 load (h2load) of raw gRPC Version calls, to containerd directly and through the proxy.

    .venv/bin/python bench/proxy_h2load.py            # a readable table
    .venv/bin/python bench/proxy_h2load.py --json     # {"direct": {...}, "proxy": {...}, "ratio": ...}

h2load (Debian `nghttp2-client`) drives far harder than grpcio clients: here
100 concurrent streams (`--clients` connections x `--streams` each) send a
prepared request body (a gRPC-framed VersionRequest) with `te: trailers` and
`content-type: application/grpc` to /runtime.v1.RuntimeService/Version. Both
targets are unix sockets (h2load -B unix:PATH): containerd's own, and the
proxy's in front of it (`python -m runtimeproxy.main`, its own process, no
hooks: Version is a pass-through call). Rounds alternate direct and proxied;
the result is each side's median requests/s and their ratio.

`--baseline DIR` also starts the proxy of another checkout (e.g. `git worktree
add /tmp/old HEAD`) in front of the same containerd and runs it in the same
alternation, so that a change is judged against the code before it under the
same load (`baseline` in the result, with its CPU per request).

No errors means: h2load counts every request done and succeeded, none
failed, errored or timed out, all HTTP 200; and, because a gRPC error is an
HTTP 200 too, every answer carried its message (h2load's DATA bytes are the
requests times one Version answer), and through the proxy its own metrics
count every call with gRPC status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.containerd.harness import Containerd  # noqa: E402

PATH = "/runtime.v1.RuntimeService/Version"
#: VersionRequest{version: "v1"}, gRPC-framed
REQUEST_BODY = b"\x00\x00\x00\x00\x04" + b"\n\x02v1"


@dataclass(frozen=True)
class Round:
    rps: float
    seconds: float
    requests: int
    succeeded: int
    failed: int
    errored: int
    timeout: int
    status_2xx: int
    data_bytes: int


def h2load_argv(socket_path: str, body: str, *, requests: int, clients: int, streams: int, threads: int) -> list[str]:
    return [
        "h2load", "-n", str(requests), "-c", str(clients), "-m", str(streams), "-t", str(threads),
        "-d", body, "-H", "te: trailers", "-H", "content-type: application/grpc",
        "-B", f"unix:{socket_path}", f"http://localhost{PATH}",
    ]


def run_h2load(argv: list[str]) -> Round:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    text = out.stdout
    if out.returncode != 0 or "finished in" not in text:
        raise RuntimeError(f"h2load failed ({out.returncode}):\n{text[-2000:]}\n{out.stderr[-2000:]}")

    def number(pattern: str) -> int:
        found = re.search(pattern, text)
        if found is None:
            raise RuntimeError(f"no {pattern!r} in h2load's report:\n{text[-2000:]}")
        return int(found.group(1))

    finished = re.search(r"finished in ([0-9.]+)(us|ms|s), ([0-9.]+) req/s", text)
    if finished is None:
        raise RuntimeError(f"no rate in h2load's report:\n{text[-2000:]}")
    return Round(
        rps=float(finished.group(3)),
        seconds=float(finished.group(1)) / {"us": 1e6, "ms": 1e3, "s": 1.0}[finished.group(2)],
        requests=number(r"requests: (\d+) total"),
        succeeded=number(r"(\d+) succeeded"),
        failed=number(r"(\d+) failed"),
        errored=number(r"(\d+) errored"),
        timeout=number(r"(\d+) timeout"),
        status_2xx=number(r"status codes: (\d+) 2xx"),
        data_bytes=number(r"\((\d+)\) data"),
    )


def errors(r: Round, *, answer_len: int) -> int:
    """Requests that did not end with a whole Version answer."""
    return max(
        r.requests - r.succeeded, r.failed + r.errored + r.timeout, r.requests - r.status_2xx,
        r.requests - r.data_bytes // answer_len if answer_len else r.requests,
    )


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def proxied_ok_calls(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        labels = re.match(r"fgpu_runtime_proxy_calls_total\{(.*)\} (\S+)$", line)
        if labels and 'method="RuntimeService/Version"' in labels.group(1) and re.search(
            r'code="(0|OK)"', labels.group(1)
        ):
            total += float(labels.group(2))
    return total


def relay_build(tree: str) -> str:
    """How a checkout's proxy runs its relay: compiled (mypyc, setup.py) or python, and on which event loop."""
    if not os.path.exists(os.path.join(tree, "runtimeproxy", "compiled.py")):
        return "python; asyncio (a checkout from before the compiled relay)"
    code = ("import runtimeproxy, runtimeproxy.main as m; from runtimeproxy import compiled; "
            "print(compiled.build, 'uvloop' if m.event_loop_factory() else 'asyncio', sep='; ')")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": tree})
    return out.stdout.strip() or f"unknown ({out.stderr.strip()[-200:]})"


def run(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is not installed: apt-get install nghttp2-client")
    base = tempfile.mkdtemp(prefix="fgpu-h2load-", dir="/tmp")
    body = os.path.join(base, "version.bin")
    with open(body, "wb") as f:
        f.write(REQUEST_BODY)
    ctrd = Containerd()
    proxies: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    try:
        ctrd.start()
        targets = {"direct": ctrd.socket_path}
        trees = {"proxy": ROOT, **({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})}
        for name, tree in trees.items():
            listen = os.path.join(base, f"{name}.sock")
            hook_dir = os.path.join(base, f"{name}-hooks.d")
            os.makedirs(hook_dir)
            ports[name] = free_port()
            with open(os.path.join(base, f"{name}.log"), "wb") as log:
                proxies[name] = subprocess.Popen(
                    [sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{listen}", "--backend",
                     ctrd.address, "--hook-config-dir", hook_dir, "--admin-listen", "",
                     "--metrics-listen", f"127.0.0.1:{ports[name]}", "--log-level", "warning"],
                    cwd=tree, stdout=log, stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + 20
            while not os.path.exists(listen):
                if proxies[name].poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(base, f"{name}.log")) as f:
                        raise RuntimeError(f"the {name} proxy did not start:\n{f.read()[-3000:]}")
                time.sleep(0.02)
            targets[name] = listen
        listen = targets["proxy"]

        def argv(target: str, requests: int) -> list[str]:
            return h2load_argv(targets[target], body, requests=requests, clients=args.clients, streams=args.streams,
                               threads=args.threads)

        # one call each: the answer's length (the same both ways), then a warm-up
        single = {t: run_h2load(h2load_argv(targets[t], body, requests=1, clients=1, streams=1, threads=1)) for t in targets}
        answer_len = single["direct"].data_bytes
        if any(r.data_bytes != answer_len for r in single.values()) or not answer_len:
            raise RuntimeError(f"Version answers differ: {single}")
        for t in targets:
            run_h2load(argv(t, args.warmup))
        rounds: dict[str, list[Round]] = {t: [] for t in targets}
        metric_errors = dict.fromkeys(proxies, 0)
        cpu_share: dict[str, list[float]] = {t: [] for t in proxies}
        cpu_per_request: dict[str, list[float]] = {t: [] for t in proxies}
        for i in range(args.rounds):
            # every other round in reverse, so that no side always follows the same one
            for t in (list(targets) if i % 2 == 0 else list(reversed(targets))):
                proc = proxies.get(t)
                before = proxied_ok_calls(ports[t]) if proc is not None else 0.0
                cpu0 = cpu_seconds(proc.pid) if proc is not None else 0.0
                r = run_h2load(argv(t, args.requests))
                if proc is not None:
                    used = cpu_seconds(proc.pid) - cpu0
                    cpu_share[t].append(used / r.seconds)
                    cpu_per_request[t].append(used / r.requests * 1e6)
                    metric_errors[t] += r.requests - int(proxied_ok_calls(ports[t]) - before)
                rounds[t].append(r)
        result: dict[str, Any] = {}
        for t in targets:
            result[t] = {
                "median_rps": round(statistics.median(r.rps for r in rounds[t]), 1),
                "rounds_rps": [round(r.rps, 1) for r in rounds[t]],
                "errors": sum(errors(r, answer_len=answer_len) for r in rounds[t]) + metric_errors.get(t, 0),
                "requests": sum(r.requests for r in rounds[t]),
            }
            if t in proxies:
                # the proxy runs one event loop: near 1.0 it is the bottleneck, a core of its own at full use
                result[t]["cpu_cores_used"] = round(statistics.median(cpu_share[t]), 2)
                # less sensitive to the machine's load than the ratio (user+sys, clock ticks)
                result[t]["cpu_us_per_request"] = round(statistics.median(cpu_per_request[t]), 2)
        for t, tree in trees.items():
            result[t]["relay_build"] = relay_build(tree)
        result["ratio"] = round(result["proxy"]["median_rps"] / result["direct"]["median_rps"], 3)
        if "baseline" in result:
            result["baseline_ratio"] = round(result["baseline"]["median_rps"] / result["direct"]["median_rps"], 3)
        result["load_average_1m"] = round(os.getloadavg()[0], 2)
        result["concurrency"] = {"clients": args.clients, "streams_per_client": args.streams, "threads": args.threads}
        result["h2load"] = " ".join(
            a if " " not in a else repr(a) for a in argv("proxy", args.requests)
        ).replace(listen, "PROXY.sock").replace(body, "version.bin")
        result["_rounds"] = {t: [asdict(r) for r in rounds[t]] for t in targets}
        return result
    finally:
        for proc in proxies.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        ctrd.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side, alternating (median reported)")
    parser.add_argument("--requests", type=int, default=300_000, help="requests per round")
    parser.add_argument("--warmup", type=int, default=10_000, help="requests per side before the rounds")
    parser.add_argument("--clients", type=int, default=4, help="h2load connections")
    parser.add_argument("--streams", type=int, default=25, help="concurrent streams per connection")
    parser.add_argument("--threads", type=int, default=2, help="h2load threads")
    parser.add_argument("--baseline", metavar="DIR", help="also run the proxy of this checkout, alternating (A/B)")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("_")}))
        return 0
    conc = result["concurrency"]
    print(f"h2load, {conc['clients']} connections x {conc['streams_per_client']} streams, "
          f"{args.requests} Version calls per round, {args.rounds} rounds each")
    for t in ("direct", "proxy", "baseline"):
        if t not in result:
            continue
        r = result[t]
        cpu = f"  CPU {r['cpu_us_per_request']} us/request, {r['cpu_cores_used']} cores" if "cpu_cores_used" in r else ""
        cpu += f"  relay {r['relay_build']}" if "relay_build" in r else ""
        print(f"{t:8s} median {r['median_rps']:9.1f} req/s  rounds {r['rounds_rps']}  errors {r['errors']}{cpu}")
    baseline = f"   baseline/direct {result['baseline_ratio']:.0%}" if "baseline_ratio" in result else ""
    print(f"proxied/direct {result['ratio']:.0%}{baseline}   load average {result['load_average_1m']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
