"""The `embedded` state backend: agent reports and allocations in one SQLite file.

For a machine without a cluster (hack/local-up.sh, a workstation): agents
send `ReportDevices` over gRPC, callers Bind over gRPC, and both are written
here before the caller gets an answer, so a restarted scheduler rebuilds the
same state as any other backend does, from a `Snapshot`.

Bound pods are stored as the pod JSON with `spec.nodeName` and the signed
annotations filled in, exactly what the kubernetes backend would read back
from the API. There is no API server to say a pod has gone, so `release`
(gRPC Unreserve of a bound pod) forgets it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from apis.devices import NodeDevices, from_proto, to_proto
from apis.fgpu.v1 import device_pb2
from scheduler_plugin import pods
from scheduler_plugin.backend import JSON, Snapshot, StateSink
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.errors import Conflict, Unavailable

log = logging.getLogger(__name__)

_SCHEMA_VERSION = "1"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS devices (node_name TEXT PRIMARY KEY, report TEXT NOT NULL, updated_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pods ("
    " uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,"
    " node_name TEXT NOT NULL, manifest TEXT NOT NULL, bound_at REAL NOT NULL)",
)


class EmbeddedBackend:
    def __init__(self, *, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(parent, exist_ok=True)
            # check_same_thread=False: gRPC worker threads share this one connection, serialized by _lock.
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            with self._transaction():
                for statement in _SCHEMA:
                    self._db.execute(statement)
                row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is None:
                    self._db.execute("INSERT INTO meta(key, value) VALUES('schema', ?)", (_SCHEMA_VERSION,))
                elif row[0] != _SCHEMA_VERSION:
                    raise Unavailable(
                        f"--db={path!r}: schema version {row[0]}, this scheduler reads {_SCHEMA_VERSION}; "
                        "use a new file or the matching scheduler version"
                    )
        except (sqlite3.Error, OSError) as exc:
            raise Unavailable(f"--db={path!r}: cannot open the state file ({exc}); check the path and permissions") from exc

    # --- Backend ----------------------------------------------------------------

    def start(self, sink: StateSink) -> None:
        sink.load(self.snapshot())

    def stop(self) -> None:
        with self._lock:
            self._db.close()

    def snapshot(self) -> Snapshot:
        with self._lock:
            device_rows = self._db.execute("SELECT node_name, report FROM devices ORDER BY node_name").fetchall()
            pod_rows = self._db.execute("SELECT uid, manifest FROM pods ORDER BY bound_at, uid").fetchall()
        devices: list[NodeDevices] = []
        for node, report in device_rows:
            try:
                devices.append(from_proto(json_format.Parse(report, device_pb2.NodeDeviceReport())))
            except (json_format.ParseError, ValueError) as exc:
                log.error("embedded state: devices of node %s unreadable, skipped: %s", node, exc)
        bound: list[JSON] = []
        for uid, manifest in pod_rows:
            try:
                obj = json.loads(manifest)
            except ValueError as exc:
                log.error("embedded state: pod %s unreadable, skipped: %s", uid, exc)
                continue
            if isinstance(obj, dict):
                bound.append(obj)
        return Snapshot(devices=tuple(devices), nodes=(), pods=tuple(bound))

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        uid = pods.uid(pod)
        stored = copy.deepcopy(dict(pod))
        metadata = stored.setdefault("metadata", {})
        metadata["annotations"] = {**pods.annotations_of(pod), **annotations}
        stored.setdefault("spec", {})["nodeName"] = node
        with self._lock, self._transaction():
            row = self._db.execute("SELECT node_name, manifest FROM pods WHERE uid=?", (uid,)).fetchone()
            if row is not None:
                if row[0] != node:
                    raise Conflict(f"pod {pods.key(pod)} (uid {uid}) is bound to node {row[0]} already, not {node}")
                if pods.annotations_of(json.loads(row[1])) == metadata["annotations"]:
                    return
            self._db.execute(
                "INSERT OR REPLACE INTO pods(uid, namespace, name, node_name, manifest, bound_at) VALUES(?,?,?,?,?,?)",
                (
                    uid,
                    str(metadata.get("namespace") or "default"),
                    str(metadata.get("name") or ""),
                    node,
                    json.dumps(stored, sort_keys=True, separators=(",", ":")),
                    time.time(),
                ),
            )

    def release(self, uid: str) -> bool:
        with self._lock, self._transaction():
            return self._db.execute("DELETE FROM pods WHERE uid=?", (uid,)).rowcount > 0

    def store_devices(self, devices: NodeDevices) -> None:
        report = json_format.MessageToJson(to_proto(devices), sort_keys=True, indent=None)
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO devices(node_name, report, updated_at) VALUES(?,?,?)",
                (devices.node_name, report, time.time()),
            )

    def get_pod(self, *, namespace: str, name: str) -> JSON | None:
        with self._lock:
            row = self._db.execute("SELECT manifest FROM pods WHERE namespace=? AND name=?", (namespace, name)).fetchone()
        if row is None:
            return None
        obj = json.loads(row[0])
        return obj if isinstance(obj, dict) else None

    def post_event(self, namespace: str, body: JSON) -> None:
        # No API server to hold Events: the log is where a person looks on a machine without a cluster.
        log.info("event %s/%s %s: %s", namespace, body.get("involvedObject", {}).get("name"), body.get("reason"), body.get("message"))

    # --- plumbing -----------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db, self._path)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error; sqlite errors become Unavailable."""

    def __init__(self, db: sqlite3.Connection, path: str) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise Unavailable(f"state file {self._path}: {exc}") from exc

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as err:
                self._db.execute("ROLLBACK")
                raise Unavailable(f"state file {self._path}: commit failed: {err}") from err
        else:
            self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise Unavailable(f"state file {self._path}: {exc}") from exc
