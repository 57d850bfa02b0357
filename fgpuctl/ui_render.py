"""The web view's page: server-rendered HTML and inline SVG from the `/cluster.json` document (pure).

Everything that comes from pods or nodes (names, namespaces, reasons, messages) is written through
`_e` (HTML-escaped, quotes included); the server also sends a Content-Security-Policy that allows no
script, so a name that slipped through could still run nothing. Search is a plain GET form: it
works without JavaScript.

Before the first sample the page says it is gathering the cluster's state and reloads itself (a
`<meta http-equiv=refresh>`: the policy allows no script, and none is needed).

Each GPU is an SVG group `g.gpu[data-node][data-gpu]` holding two bars, compute and memory, each
split into one `rect.share[data-pod="namespace/name"]` per pod; tests find pods on GPUs by these.
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from scheduler_plugin.sim.plotting import line_chart_svg

JSON = dict[str, Any]

_BAR_X, _BAR_W, _ROW_H = 150, 420, 34

_STYLE = """
body{font-family:sans-serif;margin:1em 2em;color:#222;max-width:1200px}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.4em}
h3{font-size:1em;margin:.6em 0 .2em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
.muted{color:#666;font-size:.85em}.num{text-align:right}.big{font-size:1.6em;font-weight:bold}.stat{display:inline-block;margin-right:2.5em}
.node{border:1px solid #ddd;border-radius:4px;padding:.3em .6em;margin:.5em 0}
.pods{list-style:none;padding:0;margin:.2em 0;font-size:.8em;display:flex;flex-wrap:wrap;gap:.2em 1em}
.sw{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:middle}
.match{font-weight:bold}.bad{color:#b00}.stale{color:#b60}form{margin:.6em 0}input{width:10em}
"""

#: seconds between reloads of the page while the first sample is being taken
GATHERING_RELOAD_S = 2

_HEAD = "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width'>"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def colour(key: str) -> str:
    """A stable colour per pod, so one pod looks the same on every GPU it holds."""
    hue = zlib.crc32(key.encode()) % 360
    return f"hsl({hue},55%,60%)"


def page(doc: JSON) -> str:
    if not doc["ready"]:
        return gathering_page(doc)
    query = doc.get("query") or {}
    out = [
        _HEAD,
        "<title>fgpu: the cluster's GPUs</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>fgpu: the cluster's GPUs</h1><p class=muted>source: {_e(doc['source'])} &middot; "
        f"sampled {_e(doc['generatedAt'])} &middot; <a href='/cluster.json'>cluster.json</a></p>",
    ]
    out.extend(f"<p class='muted note'>note: {_e(n)}</p>" for n in doc["notes"])
    out.append(_search(query))
    out.append(_cluster(doc))
    out.append(_pending(doc["pending"]))
    out.append(_defrag(doc["defrag"], doc["defragStatus"]))
    out.append(_nodes(doc, query))
    out.append("</body></html>")
    return "".join(out)


def gathering_page(doc: JSON) -> str:
    """The page before the first sample: what is being read and since when, or why it failed."""
    refresh = doc.get("refresh") or {}
    if doc["error"]:
        every = refresh.get("intervalSeconds")
        state = (f"<p class=bad id=gather-error>the first sample failed: {_e(doc['error'])}</p>"
                 f"<p class=muted>trying again every {_e(every)} s; this page reloads itself</p>")
    else:
        state = (f"<p id=gathering class=big>gathering cluster state&hellip;</p><p class=muted>reading {_e(doc['source'])} "
                 f"since {_e(doc['waitingSince'])}; this page reloads itself every {GATHERING_RELOAD_S} s</p>")
    return (
        f"{_HEAD}<meta http-equiv=refresh content={GATHERING_RELOAD_S}><title>fgpu: gathering cluster state</title>"
        f"<style>{_STYLE}</style></head><body><h1>fgpu: the cluster's GPUs</h1>{state}</body></html>"
    )


def error_page(message: str) -> str:
    return f"<!doctype html><html lang=en><head><meta charset=utf-8><title>fgpu: bad request</title></head><body><p class=bad>{_e(message)}</p></body></html>"


def _search(query: Mapping[str, Any]) -> str:
    def field(name: str, key: str, label: str) -> str:
        return f"<label>{label} <input name={name} value='{_e(query.get(key, ''))}'></label> "

    return (
        "<form id=search method=get action='/'>"
        + field("ns", "namespace", "namespace")
        + field("pod", "pod", "pod")
        + field("model", "model", "model")
        + f"<input type=hidden name=per_page value='{_e(query.get('perPage', ''))}'>"
        + "<button type=submit>search</button> <a href='/'>clear</a></form>"
    )


def _cluster(doc: JSON) -> str:
    c = doc["cluster"]
    frag = "n/a" if c["fragmentationPercent"] is None else f"{c['fragmentationPercent']:.1f}%"
    out = [
        "<section id=cluster><h2>Cluster</h2><p>",
        _stat("allocation", f"{c['allocationPercent']:.1f}%", "compute allocated"),
        _stat("memory", f"{c['memoryPercent']:.1f}%", "memory allocated"),
        _stat("fragmentation", frag, "fragmented (FGD, % of GPU capacity)"),
        _stat("healthy", f"{c['healthyGpus']}/{c['gpus']}", "GPUs healthy"),
        "</p>",
        "<table id=models><tr><th>model</th><th>GPUs</th><th>healthy</th><th>free</th><th>shared</th>"
        "<th>compute alloc.</th><th>memory alloc.</th></tr>",
    ]
    for m in c["models"]:
        out.append(
            f"<tr data-model='{_e(m['model'])}'><td>{_e(m['model'])}</td><td class=num>{m['gpus']}</td>"
            f"<td class=num>{m['healthyGpus']}</td><td class=num>{m['freeGpus']}</td><td class=num>{m['sharedGpus']}</td>"
            f"<td class=num>{_pct(m['core']['allocated'], m['core']['total'])}</td>"
            f"<td class=num>{_gib(m['memory']['allocatedBytes'])} / {_gib(m['memory']['totalBytes'])}</td></tr>"
        )
    out.append("</table>")
    out.append(_history(doc["history"]))
    out.append("</section>")
    return "".join(out)


def _stat(key: str, value: str, label: str) -> str:
    return f"<span class=stat><span class=big id={key}>{_e(value)}</span><br><span class=muted>{_e(label)}</span></span>"


def _history(history: list[JSON]) -> str:
    if not history:
        return ""
    last = history[-1]["t"]
    span = max(1.0, (last - history[0]["t"]) / 60)

    def series(key: str) -> list[tuple[float, float]]:
        return [((s["t"] - last) / 60, float("nan") if s[key] is None else s[key]) for s in history]

    chart = line_chart_svg(
        {
            "compute allocated %": series("allocationPercent"),
            "memory allocated %": series("memoryPercent"),
            "fragmentation % (FGD)": series("fragmentationPercent"),
        },
        x_label="minutes ago (sampled by this server)",
        y_label="% of GPU capacity",
        x_range=(-span, 0.0),
        width=640,
        height=240,
    )
    return f"<h3>Over the last {span / 60:.1f} h ({len(history)} samples)</h3><div id=history>{chart}</div>"


def _pending(pending: JSON) -> str:
    out = ["<section id=pending><h2>Pending GPU pods</h2>"]
    if not pending["reachable"]:
        out.append(f"<p class=muted id=pending-note>{_e(pending['note'])}</p></section>")
        return "".join(out)
    if not pending["pods"]:
        out.append("<p class=muted>none</p></section>")
        return "".join(out)
    out.append("<table><tr><th>pod</th><th>asks for</th><th>why not placed (nodes)</th><th>last scheduler message</th></tr>")
    for p in pending["pods"]:
        key = f"{p['namespace']}/{p['name']}"
        reasons = "".join(f"<li><b>{r['nodes']}</b> node(s): <span class=reason>{_e(r['reason'])}</span></li>" for r in p["reasons"])
        out.append(
            f"<tr class=pending-pod data-pod='{_e(key)}'><td>{_e(key)}</td><td>{_e(p['wants'])}</td>"
            f"<td><span class=summary>{_e(p['summary'])}</span><ul>{reasons}</ul></td><td>{_e(p['message'])}</td></tr>"
        )
    out.append("</table>")
    more = int(pending.get("more", 0))
    if more:
        out.append(f"<p class=muted id=pending-more>{more} more pending pod{'s' if more != 1 else ''}: "
                   "narrow them with the namespace or pod search</p>")
    out.append("</section>")
    return "".join(out)


def _defrag(plan: JSON | None, status: JSON) -> str:
    out = ["<section id=defrag><h2>Defrag plan</h2>", _plan_status(status)]
    if plan is None:
        out.append("</section>")
        return "".join(out)
    shape = plan["pending"]
    out.append(
        f"<p>What <code>fgpuctl defrag-plan --gpus {shape['gpus']} --gpu-milli {shape['gpu_milli']}</code> would move "
        "(a plan: nothing is evicted).</p><table id=defrag-summary><tr><th></th><th>before</th><th>after</th></tr>"
    )
    for label, key in (("pending pods fit", "pending_fit"), ("free whole GPUs", "free_whole_gpus"),
                       ("free 8-GPU nodes", "free_8gpu_nodes"), ("fragmentation %", "frag_pct")):
        out.append(f"<tr><td>{label}</td><td class=num>{_e(plan['before'][key])}</td><td class=num>{_e(plan['after'][key])}</td></tr>")
    out.append("</table>")
    if plan["moves"]:
        out.append("<ol id=moves>")
        out.extend(
            f"<li class=move data-pod='{_e(m['pod'])}'>move {_e(m['pod'])}: {_e(m['from'])} &rarr; {_e(m['to'])}"
            f" (GPU {_e(','.join(map(str, m['gpus'])) or '-')})</li>"
            for m in plan["moves"]
        )
        out.append("</ol>")
    else:
        out.append("<p class=muted>no move helps within the budget</p>")
    out.extend(f"<p class=muted>note: {_e(n)}</p>" for n in plan["notes"])
    out.append("</section>")
    return "".join(out)


def _plan_status(status: JSON) -> str:
    """Which plan is shown, how old it is and, when it is not the latest attempt's, why."""
    state, reason = status["state"], status["reason"]
    made = f"made on the sample of {_e(status['plannedAt'])} in {status['tookSeconds']:.1f} s" if status["plannedAt"] else ""
    text = {
        "pending": f"the first plan is being made ({_e(reason)})" if reason else "the first plan is being made",
        "current": made,
        "stale": f"stale: {_e(reason)}",
        "unavailable": f"unavailable: {_e(reason)}",
        "off": _e(reason),
    }[state]
    css = {"stale": "stale", "unavailable": "bad"}.get(state, "muted")
    return f"<p id=defrag-status class={css} data-state={_e(state)}>{text}</p>"


def _nodes(doc: JSON, query: Mapping[str, Any]) -> str:
    page_no, pages = query.get("page", 1), query.get("pages", 1)
    out = [f"<section id=nodes><h2>Nodes ({query.get('matchingNodes', len(doc['nodes']))}"
           f"{' matching' if query.get('namespace') or query.get('pod') or query.get('model') else ''})</h2>"]
    nav = _pager(query, page_no, pages)
    out.append(nav)
    wanted_ns, wanted_pod = str(query.get("namespace", "")).lower(), str(query.get("pod", "")).lower()
    searching = bool(wanted_ns or wanted_pod)
    for node in doc["nodes"]:
        out.append(_node(node, searching=searching, ns=wanted_ns, pod=wanted_pod))
    out.append(nav)
    out.append("</section>")
    return "".join(out)


def _pager(query: Mapping[str, Any], page_no: int, pages: int) -> str:
    if pages <= 1:
        return ""
    base = {k: v for k, v in (("ns", query.get("namespace")), ("pod", query.get("pod")), ("model", query.get("model")),
                              ("per_page", query.get("perPage"))) if v}
    links = []
    if page_no > 1:
        links.append(f"<a href='/?{_e(urlencode({**base, 'page': page_no - 1}))}'>&larr; previous</a>")
    links.append(f"page {page_no} of {pages}")
    if page_no < pages:
        links.append(f"<a href='/?{_e(urlencode({**base, 'page': page_no + 1}))}' rel=next>next &rarr;</a>")
    links.append(f"<a href='/?{_e(urlencode({**base, 'per_page': 'all'}))}'>all</a>")
    return "<p class=pager>" + " &middot; ".join(links) + "</p>"


def _node(node: JSON, *, searching: bool, ns: str, pod: str) -> str:
    name = _e(node["name"])
    facts = [f"driver {_e(node['driverVersion'] or '?')}"]
    if node.get("fragmentationMilli") is not None:
        facts.append(f"fragmentation {node['fragmentationMilli'] / 1000:.2f} GPU")
    if node.get("nvlinkGroups"):
        facts.append("NVLink groups " + " ".join("{" + ",".join(map(str, g)) + "}" for g in node["nvlinkGroups"]))
    if node["discoveryError"]:
        facts.append(f"<span class=bad>discovery error: {_e(node['discoveryError'])}</span>")
    isolation = node.get("isolation")
    if isolation is not None and not isolation["ready"]:
        facts.append(f"<span class=bad>refuses GPU shares: {_e(isolation['reason'])}</span>")
    gpus = node["gpus"]
    height = max(1, len(gpus)) * _ROW_H + 4
    svg = [f"<svg class=gpus width=860 height={height} font-family=sans-serif font-size=11 xmlns='http://www.w3.org/2000/svg'>"]
    legend: dict[str, bool] = {}
    for row, gpu in enumerate(gpus):
        svg.append(_gpu(node["name"], gpu, y=row * _ROW_H + 2, legend=legend, searching=searching, ns=ns, pod=pod))
    svg.append("</svg>")
    pods = "".join(
        f"<li{' class=match' if hit else ''}><span class=sw style='background:{colour(key)}'></span>{_e(key)}</li>"
        for key, hit in sorted(legend.items())
    )
    return (
        f"<div class=node id='node-{name}' data-node='{name}'><h3>{name}</h3>"
        f"<div class=muted>{' &middot; '.join(facts)}</div>{''.join(svg)}<ul class=pods>{pods}</ul></div>"
    )


def _gpu(node: str, gpu: JSON, *, y: int, legend: dict[str, bool], searching: bool, ns: str, pod: str) -> str:
    health = "healthy" if gpu["healthy"] else "unhealthy"
    out = [
        f"<g class=gpu data-node='{_e(node)}' data-gpu='{gpu['index']}' data-health={health}>",
        f"<text x=0 y={y + 12}>GPU {gpu['index']} {_e(gpu['model'])}</text>",
    ]
    if gpu.get("nvlinkGroup", -1) >= 0:
        out.append(f"<text x=0 y={y + 26} fill='#666'>NVLink group {gpu['nvlinkGroup']}</text>")
    total_mem = gpu["memory"]["totalBytes"] or 1
    for lane, kind in ((0, "core"), (1, "memory")):
        top = y + 2 + lane * 14
        out.append(f"<rect x={_BAR_X} y={top} width={_BAR_W} height=12 fill='#f2f2f2' stroke='#bbb'/>")
        x = float(_BAR_X)
        for p in gpu["pods"]:
            key = f"{p['namespace']}/{p['name']}"
            fraction = p["corePercent"] / 100 if kind == "core" else p["memoryBytes"] / total_mem
            width = min(fraction, 1.0) * _BAR_W
            hit = searching and ns in p["namespace"].lower() and pod in p["name"].lower()
            legend[key] = legend.get(key, False) or hit
            extra = " stroke=#000 stroke-width=2" if hit else ""
            amount = f"{p['corePercent']}% compute" if kind == "core" else f"{_gib(p['memoryBytes'])} memory"
            out.append(
                f"<rect class='share {kind}' data-pod='{_e(key)}' x={x:.1f} y={top} width={width:.1f} height=12 "
                f"fill='{colour(key)}'{extra}><title>{_e(key)}: {amount}"
                f"{' (assumed)' if p['assumed'] else ''}{' (unverified)' if p['unverified'] else ''}</title></rect>"
            )
            x += width
        out.append(f"<text x={_BAR_X + _BAR_W + 6} y={top + 10} fill='#444'>{kind} "
                   + (f"{gpu['core']['allocated']}%" if kind == "core" else
                      f"{_gib(gpu['memory']['allocatedBytes'])}/{_gib(gpu['memory']['totalBytes'])}") + "</text>")
    status_x = _BAR_X + _BAR_W + 130
    if not gpu["healthy"]:
        out.append(f"<text class=bad x={status_x} y={y + 12} fill='#b00'>unhealthy: {_e(gpu['healthReason'] or '?')}</text>")
    elif gpu["heldExternally"]:
        out.append(f"<text x={status_x} y={y + 12} fill='#b60'>held outside fgpu</text>")
    if gpu.get("migEnabled"):
        out.append(_mig(gpu["mig"], x=status_x, y=y + 16))
    out.append("</g>")
    return "".join(out)


def _mig(instances: list[JSON], *, x: int, y: int) -> str:
    """MIG instances as slices of a 7-slice bar (A100/H100 have 7 compute slices), each labelled with its profile."""
    out = [f"<g class=mig><text x={x} y={y + 9} fill='#444'>MIG</text>"]
    left = x + 28.0
    for m in instances:
        width = max(1, m["slices"]) / 7 * 110
        out.append(
            f"<rect class=mig-instance x={left:.1f} y={y} width={width - 1:.1f} height=12 fill='#cfe3f7' stroke='#6a8fb5'>"
            f"<title>{_e(m['profile'])}</title></rect><text x={left + 2:.1f} y={y + 9} font-size=8>{_e(m['profile'])}</text>"
        )
        left += width
    if not instances:
        out.append(f"<text x={left:.1f} y={y + 9} fill='#666'>enabled, no instances</text>")
    out.append("</g>")
    return "".join(out)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}Gi"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
