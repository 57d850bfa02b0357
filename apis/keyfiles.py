"""Key files: the scheduler's private key, the nodes' public keys and the legacy v1 key, re-read on change.

Formats (what `fgpuctl keys generate` writes, and what OpenSSL writes too):

- the private key (the scheduler's `signingKey`): PEM PKCS#8,
  "-----BEGIN PRIVATE KEY-----" (`openssl genpkey -algorithm ed25519`);
- public keys (`verifyingKeys`): PEM "-----BEGIN PUBLIC KEY-----" blocks
  (`openssl pkey -pubout`), in one file or in every file of a directory, such
  as a ConfigMap volume with one data key per public key. Names starting with
  "." are skipped (a ConfigMap volume's `..data` links); text outside the
  blocks is ignored, so a file may carry comments;
- the legacy v1 HMAC key (`legacySigningKey`): the old cluster key file,
  trailing newline stripped. A missing or empty file means none: v1 refused.

Why re-read: a rotation must restart nothing (docs/deploy.md). The sources
below read their files again at most every `min_interval_s` and parse them
when the bytes changed; a file that turns bad keeps the last good keys (and is
logged once), while one that was never good raises SigningKeyError on every
call until it is. A daemon also runs a `KeyWatcher`, so that a change is read,
and logged, when it lands rather than when the next pod comes: the rotation's
step 1 waits for each node's "accepting keys" line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from apis.signing import PublicKey, SigningKey, SigningKeyError, VerifyingKeys

log = logging.getLogger(__name__)

_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.*?-----END \1-----", re.DOTALL)
_GENERATE = "fgpuctl keys generate --out DIR"

#: (name, bytes) of every file read, in name order: what decides whether to parse again.
Snapshot = tuple[tuple[str, bytes], ...]
S = TypeVar("S")
T = TypeVar("T")


def private_pem(key: SigningKey) -> bytes:
    return key.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def public_pem(key: PublicKey) -> bytes:
    return key.key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def parse_private_key(data: bytes, *, where: str) -> SigningKey:
    """The Ed25519 private key in the PEM `data` read from `where`."""
    blocks = [m for m in _BLOCK.finditer(data) if m.group(1) == b"PRIVATE KEY"]
    if not blocks:
        hint = (
            "it looks like a v1 HMAC key from before: give that to the agents as legacySigningKey during the "
            "upgrade window, and sign with a new key"
            if data.strip() and b"-----BEGIN" not in data
            else "it holds no PEM private key"
        )
        raise SigningKeyError(
            f"signing key file {where} is not an Ed25519 private key (PEM \"-----BEGIN PRIVATE KEY-----\"): "
            f"{hint}; make one with `{_GENERATE}`"
        )
    try:
        key = load_pem_private_key(blocks[0].group(0), password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"signing key file {where}: cannot read the private key ({exc}); make one with `{_GENERATE}`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"signing key file {where} holds a {type(key).__name__}, not an Ed25519 key; make one with `{_GENERATE}`"
        )
    return SigningKey.of(key)


def parse_public_keys(data: bytes, *, where: str) -> tuple[PublicKey, ...]:
    """Every Ed25519 public key in the PEM `data` read from `where`; refuses private keys outright."""
    keys: list[PublicKey] = []
    for match in _BLOCK.finditer(data):
        kind = match.group(1).decode("ascii")
        if "PRIVATE" in kind:
            # Nodes must never hold what signs: that is the point of v2.
            raise SigningKeyError(
                f"verifying key file {where} holds a private key; nodes get public keys only: replace it with "
                f"the output of `fgpuctl keys public --in {where}` and keep the private key on the scheduler"
            )
        if kind != "PUBLIC KEY":
            continue
        try:
            key = load_pem_public_key(match.group(0))
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(
                f"verifying key file {where}: cannot read a public key ({exc}); replace it with the output of "
                "`fgpuctl keys public --in PRIVATE-KEY-FILE`, or remove the file"
            ) from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(
                f"verifying key file {where} holds a {type(key).__name__}, not an Ed25519 public key; "
                "write the scheduler's with `fgpuctl keys public`"
            )
        keys.append(PublicKey.of(key))
    if not keys:
        raise SigningKeyError(
            f"verifying key file {where} holds no public key (PEM \"-----BEGIN PUBLIC KEY-----\"); write the "
            "scheduler's with `fgpuctl keys public --in PRIVATE-KEY-FILE`, or remove the file"
        )
    return tuple(keys)


def load_key(path: str) -> SigningKey:
    """The scheduler's private key from `path`; raises SigningKeyError naming the path and the fix."""
    return parse_private_key(_read_required(path, what="signing key"), where=path)


def load_verifying_keys(path: str, *, legacy_key: str = "") -> VerifyingKeys:
    """The public keys in `path` (a file or a directory) and the legacy v1 key in `legacy_key` (optional)."""
    return _verifying_keys(path, _read_tree(path), _read_legacy(legacy_key))


def load_legacy_key(path: str) -> bytes | None:
    """The v1 HMAC key in `path`, without its trailing newline; None when no path, no file or an empty one."""
    data = _read_legacy(path)
    return _legacy_from(data)


def write_key_pair(directory: str, key: SigningKey) -> tuple[str, str]:
    """Writes `<key id>.key` (private, mode 0600) and `<key id>.pub` into `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    private = os.path.join(directory, f"{key.key_id}.key")
    public = os.path.join(directory, f"{key.key_id}.pub")
    # O_EXCL: never overwrite a key that may already be in use somewhere.
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem(key))
    with open(public, "wb") as f:
        f.write(public_pem(key.public))
    return private, public


class _Watched(Generic[S, T]):
    """A value parsed from files, re-read at most every `min_interval_s` and parsed again when the bytes change."""

    def __init__(
        self,
        read: Callable[[], S],
        parse: Callable[[S], T],
        *,
        what: str,
        describe: Callable[[T], str],
        min_interval_s: float,
        clock: Callable[[], float],
        replaced: Callable[[T, T], None] | None = None,
    ) -> None:
        """`replaced(old, new)` is told of every change after the first good value."""
        self._read = read
        self._parse = parse
        self._what = what
        self._describe = describe
        self._replaced = replaced
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: T | None = None
        self._snapshot: S | None = None
        self._checked_at = 0.0
        #: Why the files' current content is not in use; None while it is.
        self.last_error: str | None = None

    def current(self) -> T:
        with self._lock:
            now = self._clock()
            if self._value is not None and now - self._checked_at < self._min_interval_s:
                return self._value
            self._checked_at = now
            try:
                snapshot = self._read()
                if self._value is not None and snapshot == self._snapshot:
                    return self._value
                self._snapshot = snapshot
                value = self._parse(snapshot)
            except SigningKeyError as exc:
                if self._value is None:
                    raise
                if str(exc) != self.last_error:
                    log.warning("keeping the previous %s: %s", self._what, exc)
                self.last_error = str(exc)
                return self._value
            log.info("%s: %s", self._what, self._describe(value))
            if self._value is not None and self._replaced is not None:
                self._replaced(self._value, value)
            self._value = value
            self.last_error = None
            return value


class VerifyingKeyFiles:
    """A node's verifying keys: the public keys in `path` and the legacy v1 key in `legacy_path`, re-read on change.

    `path` empty: no public keys from files (the scheduler adds its own).
    """

    def __init__(
        self,
        path: str,
        *,
        legacy_path: str = "",
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.legacy_path = legacy_path
        self._watched = _Watched(
            lambda: (_read_tree(path) if path else (), _read_legacy(legacy_path)),
            self._parse,
            what=f"verifying keys ({path or 'none'}, legacy {legacy_path or 'none'})",
            describe=_describe,
            min_interval_s=min_interval_s,
            clock=clock,
            replaced=self._replaced,
        )
        self._unusable: str | None = None

    @property
    def last_error(self) -> str | None:
        return self._watched.last_error

    def verifying_keys(self) -> VerifyingKeys:
        return self._watched.current()

    def look(self) -> None:
        """Reads the files if due, for a `KeyWatcher`; never raises.

        While no good set was ever read, each new reason is logged once (the
        hook refuses GPU allocations meanwhile, with the same reason).
        """
        try:
            self.verifying_keys()
        except SigningKeyError as exc:
            if str(exc) != self._unusable:
                log.warning("no usable verifying keys yet, so GPU allocations are refused: %s", exc)
            self._unusable = str(exc)
        else:
            self._unusable = None

    def _replaced(self, old: VerifyingKeys, new: VerifyingKeys) -> None:
        # Said when it happens: the pods a drop strands run on until their next container start (or an
        # agent restart, which no longer counts their GPU share), and nothing else names them then.
        for key_id in old.key_ids:
            if new.find(key_id) is None:
                log.warning(
                    "verifying keys %s: key %s is no longer accepted: containers of pods still signed with it are "
                    "refused from now on, and a restarted agent no longer counts their GPU share; list them with "
                    "`kubectl get pods -A -o json | fgpuctl keys in-use --key %s` and delete them so that they "
                    "are signed anew (docs/deploy.md, \"Rotating the signing key\")", self.path, key_id, key_id,
                )
        if old.legacy_key is not None and new.legacy_key is None:
            log.warning(
                "legacySigningKey %s is gone: v1 (HMAC) signatures are refused from now on, and a restarted agent "
                "no longer counts the GPU share of pods that carry one; list them with "
                "`kubectl get pods -A -o json | fgpuctl keys in-use --key v1` and delete them (docs/deploy.md, "
                "\"Upgrading from v1\")", self.legacy_path,
            )

    def _parse(self, snapshot: tuple[Snapshot, bytes | None]) -> VerifyingKeys:
        files, legacy = snapshot
        keys = _verifying_keys(self.path, files, legacy) if self.path else VerifyingKeys(legacy_key=_legacy_from(legacy))
        if keys.legacy_key is not None:
            log.warning(
                "accepting v1 (HMAC) allocation signatures: legacySigningKey %s holds a key; end the upgrade "
                "window by deleting it once no pod carries a v1 signature (docs/deploy.md)", self.legacy_path,
            )
        return keys


class SchedulerKeyFiles:
    """The scheduler's `SchedulerKeys` from files: the private key in `signing_path`, re-read on change.

    It verifies with its own public key plus, when given, the keys in
    `verifying_path` and the legacy v1 key (pods signed before a rotation or
    an upgrade). The files are read once here, so a bad key stops the start.
    """

    def __init__(
        self,
        signing_path: str,
        *,
        verifying_path: str = "",
        legacy_path: str = "",
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._signing = _Watched(
            lambda: ((signing_path, _read_required(signing_path, what="signing key")),),
            lambda snapshot: parse_private_key(snapshot[0][1], where=signing_path),
            what=f"signing key ({signing_path})",
            describe=lambda key: f"signing with key {key.key_id}",
            min_interval_s=min_interval_s,
            clock=clock,
        )
        self._verifying = VerifyingKeyFiles(
            verifying_path, legacy_path=legacy_path, min_interval_s=min_interval_s, clock=clock
        )
        self.verifying_keys()  # reads both: a missing or bad file raises here

    def signing_key(self) -> SigningKey:
        return self._signing.current()

    def look(self) -> None:
        """Reads both if due, for a `KeyWatcher` (so "signing with key" is logged when the Secret changes); never raises.

        Only a bad file after a good one can fail here, and that keeps the last good key, logged by itself.
        """
        with contextlib.suppress(SigningKeyError):
            self.signing_key()
        self._verifying.look()

    def verifying_keys(self) -> VerifyingKeys:
        return self._verifying.verifying_keys().with_keys(self.signing_key().public)


class KeyWatcher:
    """Calls `look` every `interval_s` in a thread of its own, until stopped.

    Key files are otherwise read when a pod needs them, so an idle node would
    neither take a new key nor say so, and the operator waits on that line.
    """

    def __init__(self, look: Callable[[], None], *, interval_s: float = 1.0, name: str = "key-watcher") -> None:
        self._look = look
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(grace)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._look()
            except Exception:  # a bug here must not end the watching; the next look tries again
                log.exception("looking at the key files failed unexpectedly")
            self._stop.wait(self._interval_s)


def _verifying_keys(path: str, files: Snapshot, legacy: bytes | None) -> VerifyingKeys:
    keys: list[PublicKey] = []
    for name, data in files:
        keys.extend(parse_public_keys(data, where=name))
    if not keys:
        raise SigningKeyError(
            f"verifying keys {path}: no public key file in the directory; add the scheduler's public key "
            "(`fgpuctl keys public --in PRIVATE-KEY-FILE`)"
        )
    return VerifyingKeys(legacy_key=_legacy_from(legacy)).with_keys(*keys)


def _describe(keys: VerifyingKeys) -> str:
    legacy = "; v1 (HMAC) signatures accepted" if keys.legacy_key is not None else ""
    return f"accepting keys {', '.join(keys.key_ids) or 'none'}{legacy}"


def _read_required(path: str, *, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SigningKeyError(f"{what} file {path} does not exist; make a key pair with `{_GENERATE}`") from None
    except OSError as exc:
        raise SigningKeyError(f"{what} file {path} cannot be read: {exc.strerror}") from None
    if not data.strip():
        raise SigningKeyError(f"{what} file {path} is empty; make a key pair with `{_GENERATE}`")
    return data


def _read_tree(path: str) -> Snapshot:
    """(file, bytes) of `path` itself, or of every visible regular file in it when it is a directory."""
    if not os.path.isdir(path):
        return ((path, _read_required(path, what="verifying key")),)
    try:
        entries = sorted(os.listdir(path))
    except OSError as exc:
        raise SigningKeyError(f"verifying keys directory {path} cannot be listed: {exc.strerror}") from None
    files = [os.path.join(path, e) for e in entries if not e.startswith(".")]
    # isfile follows links: a ConfigMap volume's files are links into its ..data directory.
    return tuple((f, _read_required(f, what="verifying key")) for f in files if os.path.isfile(f))


def _read_legacy(path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        # The end of the upgrade window is deleting this key (an optional Secret volume then empties).
        return None
    except OSError as exc:
        raise SigningKeyError(f"legacy signing key file {path} cannot be read: {exc.strerror}") from None


def _legacy_from(data: bytes | None) -> bytes | None:
    key = (data or b"").rstrip(b"\r\n")
    return key or None
