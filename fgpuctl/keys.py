"""`fgpuctl keys`: the keys that sign allocations, made and rotated without restarting anything.

    fgpuctl keys generate --out DIR          a new key pair: DIR/<key id>.key (private, mode 0600), DIR/<key id>.pub
    fgpuctl keys public --in FILE [-o pem|patch]
                                             the public key of a private key, as PEM or as a merge patch that
                                             adds it to the fgpu-verifying-keys ConfigMap ("-" reads stdin)
    fgpuctl keys list PATH...                the key id, kind and file of every key in these files or directories
    fgpuctl keys in-use [-f FILE] [--key ID] which keys signed the allocations of pods that are not finished
                                             (FILE: `kubectl get pods -A -o json`; "-" or none reads stdin)

The scheduler signs with one private key; every node accepts the public keys
in its set (docs/deploy.md, "Rotating the signing key"). Exit status: 0 done,
1 a key or the input cannot be read, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from apis import names
from apis.allocation import lists_gpus
from apis.keyfiles import load_key, parse_private_key, parse_public_keys, public_pem, write_key_pair
from apis.signing import SigningKey, SigningKeyError, signature_key_id

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_USAGE = 2

#: Where the shipped manifests keep the keys (hack/deploy/).
NAMESPACE = "fgpu-system"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
#: What `in-use --key` can match: a key id as signatures carry it, or the two groups `keys_in_use` adds.
_KEY_ARGUMENT = re.compile(r"[0-9a-f]{16}|v1|unsigned")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="keys_verb", metavar="ACTION")
    gen = sub.add_parser("generate", help="make a new Ed25519 key pair in a directory")
    gen.add_argument("--out", required=True, metavar="DIR", help="directory for <key id>.key and <key id>.pub")
    pub = sub.add_parser("public", help="print the public key of a private key")
    pub.add_argument("--in", dest="source", required=True, metavar="FILE", help="private key file (PEM); - reads stdin")
    pub.add_argument(
        "-o", "--output", choices=["pem", "patch"], default="pem",
        help=f"pem, or a JSON merge patch adding it to the {names.VERIFYING_KEYS_CONFIGMAP} ConfigMap",
    )
    lst = sub.add_parser("list", help="key ids of key files or directories")
    lst.add_argument("paths", nargs="+", metavar="PATH")
    use = sub.add_parser("in-use", help="which keys signed the allocations of pods that are not finished")
    use.add_argument(
        "-f", "--filename", default="-", metavar="FILE", help="`kubectl get pods -A -o json` output; - reads stdin"
    )
    use.add_argument("--key", metavar="ID", help="list the pods signed with this key id (or v1, or unsigned)")
    parser.set_defaults(_keys_parser=parser)


def run(args: argparse.Namespace) -> int:
    verb = getattr(args, "keys_verb", None)
    out, err = sys.stdout, sys.stderr
    try:
        if verb == "generate":
            return generate(args.out, out=out)
        if verb == "public":
            return public(args.source, output=args.output, stdin=sys.stdin.buffer, out=out)
        if verb == "list":
            return list_keys(args.paths, out=out)
        if verb == "in-use":
            if args.key is not None and not _KEY_ARGUMENT.fullmatch(args.key):
                # No pod would match, and an empty answer reads as "safe to drop the key".
                print(
                    f"fgpuctl keys in-use: --key={args.key!r} is not a key id: give the 16 lowercase hex digits "
                    "that `fgpuctl keys list` prints (not the file name), v1 or unsigned",
                    file=err,
                )
                return EXIT_USAGE
            return in_use(args.filename, key=args.key, stdin=sys.stdin, out=out)
    except BrokenPipeError:
        raise  # the reader left (`| head`): fgpuctl.main ends quietly, this is no key error
    except OSError as exc:
        print(f"fgpuctl keys {verb}: {_os_error(verb, args, exc)}", file=err)
        return EXIT_UNREADABLE
    except (SigningKeyError, ValueError) as exc:
        print(f"fgpuctl keys {verb}: {exc}", file=err)
        return EXIT_UNREADABLE
    args._keys_parser.print_help(err)
    return EXIT_USAGE


def _os_error(verb: str | None, args: argparse.Namespace, exc: OSError) -> str:
    """A file error as one line naming the flag and the path it was given (the OS message alone names neither)."""
    reason = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename else ""
    if verb == "generate":
        return f"--out={args.out}: cannot write the key pair there: {reason}{where}; give a directory you can write to"
    if verb == "public":
        return f"--in={args.source}: cannot read the private key: {reason}"
    if verb == "in-use":
        return f"-f={args.filename}: cannot read: {reason}; give a file of `kubectl get pods -A -o json` output, or - for stdin"
    return f"{exc.filename or ''}: cannot read: {reason}".lstrip(": ")


def generate(directory: str, *, out: TextIO, key: SigningKey | None = None) -> int:
    key = key or SigningKey.generate()
    private, public_file = write_key_pair(directory, key)
    cm, secret, data_key = names.VERIFYING_KEYS_CONFIGMAP, names.SIGNING_KEY_SECRET, names.SIGNING_KEY_FILE
    print(
        f"key id {key.key_id}\n"
        f"  private key: {private}  (the scheduler only; keep it secret)\n"
        f"  public key:  {public_file}  (every node)\n"
        "\nFirst install:\n"
        f"  kubectl -n {NAMESPACE} create configmap {cm} --from-file={public_file}\n"
        f"  kubectl -n {NAMESPACE} create secret generic {secret} --from-file={data_key}={private}\n"
        "\nRotation (docs/deploy.md, \"Rotating the signing key\"), restarting nothing:\n"
        f"  1. kubectl -n {NAMESPACE} patch configmap {cm} --type merge -p \"$(fgpuctl keys public --in {private} -o patch)\"\n"
        "     then wait until every agent logs that it accepts the new key\n"
        f"  2. kubectl -n {NAMESPACE} create secret generic {secret} --from-file={data_key}={private} "
        "--dry-run=client -o yaml | kubectl apply -f -\n"
        "  3. once `kubectl get pods -A -o json | fgpuctl keys in-use --key OLD-ID` lists no pod:\n"
        f"     kubectl -n {NAMESPACE} patch configmap {cm} --type merge -p '{{\"data\":{{\"OLD-ID.pub\":null}}}}'",
        file=out,
    )
    return EXIT_OK


def public(source: str, *, output: str, stdin: Any, out: TextIO) -> int:
    key = parse_private_key(stdin.read(), where="stdin") if source == "-" else load_key(source)
    pem = public_pem(key.public).decode("ascii")
    if output == "patch":
        print(json.dumps({"data": {f"{key.key_id}.pub": pem}}), file=out)
    else:
        print(pem, end="", file=out)
    return EXIT_OK


def list_keys(paths: Iterable[str], *, out: TextIO) -> int:
    for path in paths:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if not f.startswith(".")] if os.path.isdir(path) else [path]
        for file in files:
            if not os.path.isfile(file):
                continue
            with open(file, "rb") as f:
                data = f.read()
            if b"PRIVATE KEY-----" in data:
                key = parse_private_key(data, where=file)
                print(f"{key.key_id}  private  {file}", file=out)
                continue
            for public_key in parse_public_keys(data, where=file):
                print(f"{public_key.key_id}  public   {file}", file=out)
    return EXIT_OK


def in_use(source: str, *, key: str | None, stdin: TextIO, out: TextIO) -> int:
    if source == "-":
        text = stdin.read()
    else:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc}); give `kubectl get pods -A -o json` output") from None
    by_key = keys_in_use(_pods(document, source))
    if key is not None:
        for pod in by_key.get(key, []):
            print(pod, file=out)
        return EXIT_OK
    print(f"{'KEY':<18}PODS", file=out)
    for key_id, listed in sorted(by_key.items()):
        print(f"{key_id:<18}{len(listed)}", file=out)
    return EXIT_OK


def _pods(document: object, source: str) -> list[Any]:
    """The pods of `kubectl get pods -A -o json` output (a List, or one Pod), checked for the shape read.

    Input of another shape is refused, not read as "no pod": an empty answer tells the operator
    that the old key may be dropped, which would break the pods it still signs.
    """
    fix = "give `kubectl get pods -A -o json` output"
    if not isinstance(document, Mapping):
        raise ValueError(f"{source}: a JSON {type(document).__name__}, not a pod list; {fix}")
    pods = document.get("items", [document])
    if not isinstance(pods, list):
        raise ValueError(f"{source}: items: expected a list of pods, got {type(pods).__name__}; {fix}")
    for index, pod in enumerate(pods):
        where = f"{source}: items[{index}]"
        if not isinstance(pod, Mapping):
            raise ValueError(f"{where}: expected a pod object, got {type(pod).__name__}; {fix}")
        for field in ("metadata", "status"):
            if not isinstance(pod.get(field) or {}, Mapping):
                raise ValueError(f"{where}.{field}: expected an object, got {type(pod[field]).__name__}; {fix}")
        if not isinstance((pod.get("metadata") or {}).get("annotations") or {}, Mapping):
            got = type(pod["metadata"]["annotations"]).__name__
            raise ValueError(f"{where}.metadata.annotations: expected an object, got {got}; {fix}")
    return pods


def keys_in_use(pods: Iterable[Any]) -> dict[str, list[str]]:
    """Pure: key id (or "v1", "unsigned") -> namespace/name of the unfinished pods whose GPU allocation it signed.

    Finished pods are left out: kubelet never creates their containers again,
    so no node needs their key any more. So are allocations that list no GPU,
    which nodes accept unsigned.
    """
    out: dict[str, list[str]] = {}
    for pod in pods:
        if not isinstance(pod, Mapping):
            continue
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        if not lists_gpus(annotations.get(names.DEVICE_ALLOCATED)):
            continue
        key_id = signature_key_id(annotations.get(names.ALLOCATION_SIGNATURE, "")) or "unsigned"
        out.setdefault(key_id, []).append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return out
