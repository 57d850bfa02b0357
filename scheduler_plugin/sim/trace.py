"""Reading the Alibaba GPU trace's CSV format (cluster-trace-gpu-v2023, "openb").

Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
followed, in most files, by `gpu_spec,qos,pod_phase,...` (only `gpu_spec` matters here).
Every error names the file, the line, the column, the value and the fix, so a hand-edited
trace is easy to repair.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MILLI_PER_GPU = 1000
#: bytes per MiB (the trace gives memory in MiB)
MIB = 1 << 20


class TraceError(ValueError):
    """A trace file is missing, malformed or holds an impossible value."""


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class TracePod:
    """One pod of the trace. `gpu_milli` is per GPU (1000 = a whole GPU)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    #: GPU models the pod may run on; empty = any
    gpu_spec: tuple[str, ...] = ()

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


_BOM = b"\xef\xbb\xbf"
#: characters that mean a gpu_spec was written with another separator than `|`
_SPEC_SEPARATORS = re.compile(r"[,;\s]")


def _text(path: str | Path) -> str:
    """The file decoded as UTF-8 (a leading BOM, as Excel writes, dropped)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot open trace file ({exc.strerror}); pass the path of an openb CSV") from exc
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = skip + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise TraceError(
            f"{path}:{line}: byte {at} (0x{data[at]:02x}) is not UTF-8; save the file as UTF-8"
        ) from None


def csv_rows(path: str | Path, required: Sequence[str], *, hint: str = "") -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row) for each non-blank row of a CSV with a header holding the `required` columns.

    `line` is the physical line the row starts on. A row with more values than the header is
    refused (trailing empty values aside): a comma left unquoted would otherwise shift or drop
    data silently. CSV syntax errors (an unclosed quote, a field over csv's size limit) are
    TraceErrors naming the line the broken row starts on. `hint` is added to a missing-column error.
    """
    reader = csv.reader(io.StringIO(_text(path), newline=""), strict=True)
    start = 1
    try:
        header = [column.strip() for column in next(reader, [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"{path}: header {','.join(header) or '(empty)'} lacks column(s) {','.join(missing)}; "
                f"expected at least {','.join(required)}{hint}"
            )
        start = reader.line_num + 1
        for values in reader:
            line, start = start, reader.line_num + 1
            if not values:
                continue
            extra = values[len(header) :]
            if any(v.strip() for v in extra):
                raise TraceError(
                    f"{path}:{line}: {len(values)} values for the header's {len(header)} columns; extra value(s) "
                    f"{','.join(extra)!r}; quote a field that holds a comma (and separate gpu_spec models with |)"
                )
            yield line, dict(zip(header, values, strict=False))
    except csv.Error as exc:
        raise TraceError(
            f"{path}:{start}: the row starting here is not valid CSV ({exc}, read up to line {reader.line_num}); "
            "close every quote and quote fields that hold commas"
        ) from None


def _int(path: str | Path, line: int, row: dict[str, str], column: str, *, low: int, high: int | None = None) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column} = {raw!r} is not an integer; write a whole number") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise TraceError(f"{path}:{line}: column {column} = {value} is out of range; use a value in {bound}")
    return value


def read_nodes(path: str | Path) -> list[TraceNode]:
    """The nodes of a node-list CSV, in file order."""
    nodes: list[TraceNode] = []
    seen: dict[str, int] = {}
    for line, row in csv_rows(path, _NODE_COLUMNS):
        name = (row.get("sn") or "").strip()
        if not name or name in seen:
            problem = "is empty" if not name else f"repeats an earlier node (line {seen[name]})"
            raise TraceError(f"{path}:{line}: column sn = {name!r} {problem}; give every node a unique name")
        seen[name] = line
        gpus = _int(path, line, row, "gpu", low=0, high=64)
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise TraceError(f"{path}:{line}: column model is empty for a node with {gpus} GPU(s); name its GPU model")
        cpu_milli = _int(path, line, row, "cpu_milli", low=0)
        memory_mib = _int(path, line, row, "memory_mib", low=0)
        for column, value in (("cpu_milli", cpu_milli), ("memory_mib", memory_mib)):
            # The core reads a capacity of 0 as "not tracked", i.e. unlimited: a GPU node must state both.
            if gpus and not value:
                raise TraceError(
                    f"{path}:{line}: column {column} = 0 on a node with {gpus} GPU(s); the scheduler would read 0 "
                    "as unlimited, so give the node's real capacity"
                )
        nodes.append(TraceNode(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, gpus=gpus, model=model))
    if not nodes:
        raise TraceError(f"{path}: no nodes; the node list needs at least one row")
    return nodes


def read_pods(path: str | Path) -> list[TracePod]:
    """The pods of a pod-list CSV, in file order."""
    pods: list[TracePod] = []
    seen: dict[str, int] = {}
    for line, row in csv_rows(path, _POD_COLUMNS):
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column name is empty; give every pod a name")
        if name in seen:
            # The core keeps one reservation per pod name: a repeat would be counted but not held.
            raise TraceError(
                f"{path}:{line}: column name = {name!r} repeats the pod on line {seen[name]}; give every pod a unique name"
            )
        seen[name] = line
        num_gpu = _int(path, line, row, "num_gpu", low=0, high=64)
        gpu_milli = _int(path, line, row, "gpu_milli", low=0, high=MILLI_PER_GPU)
        if gpu_milli % 10:
            raise TraceError(
                f"{path}:{line}: column gpu_milli = {gpu_milli} is not a multiple of 10; "
                "round it to whole GPU percent (gpu_milli/10 is the core and memory percent)"
            )
        if num_gpu == 0 and gpu_milli:
            raise TraceError(
                f"{path}:{line}: gpu_milli = {gpu_milli} with num_gpu = 0; set num_gpu >= 1 or gpu_milli = 0"
            )
        if num_gpu and not gpu_milli:
            raise TraceError(f"{path}:{line}: num_gpu = {num_gpu} with gpu_milli = 0; set gpu_milli to 10..1000")
        if num_gpu > 1 and gpu_milli < MILLI_PER_GPU:
            raise TraceError(
                f"{path}:{line}: num_gpu = {num_gpu} with gpu_milli = {gpu_milli}; "
                "a sharing pod asks for one GPU, so use num_gpu = 1 or gpu_milli = 1000"
            )
        spec_raw = (row.get("gpu_spec") or "").strip()
        models = {m.strip() for m in spec_raw.split("|") if m.strip()}
        odd = sorted(m for m in models if _SPEC_SEPARATORS.search(m))
        if odd:
            raise TraceError(
                f"{path}:{line}: column gpu_spec = {spec_raw!r}: model {odd[0]!r} holds a ',', ';' or space; "
                "separate models with | (e.g. G2|T4)"
            )
        spec = tuple(sorted(models))
        pods.append(
            TracePod(
                name=name,
                cpu_milli=_int(path, line, row, "cpu_milli", low=0),
                memory_mib=_int(path, line, row, "memory_mib", low=0),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=spec if num_gpu else (),
            )
        )
    if not pods:
        raise TraceError(f"{path}: no pods; the pod list needs at least one row")
    return pods


def write_pods(path: str | Path, pods: Sequence[TracePod]) -> None:
    """A pod-list CSV that `read_pods` reads back as `pods` (the first six columns of the openb format)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow((*_POD_COLUMNS, "gpu_spec"))
        for pod in pods:
            writer.writerow((pod.name, pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, "|".join(pod.gpu_spec)))
