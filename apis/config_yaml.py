"""Reading a hand-written YAML settings file safely: one document, UTF-8, no duplicate keys, bounded.

Every daemon's config file, the hook registrations, the translation rules and the overcommit
settings are written by people (or rendered from Helm values). `yaml.safe_load` alone lets
through what those files must not hold:

* a key written twice: YAML keeps the last one silently, and the first, the one a reader
  usually looks at, is lost (Kubernetes' strict decoding refuses it too);
* bytes that are not UTF-8: `UnicodeDecodeError` is no `YAMLError`, so callers that catch the
  latter crashed;
* anchors and aliases that expand to billions of values ("billion laughs"): loading is cheap,
  because aliases share one object, but every walk over the value (a `repr` in an error message)
  hangs the daemon and eats its memory;
* nesting thousands deep: `RecursionError`, again no `YAMLError`.

`load_file` and `load_text` turn all of these into `YAMLFileError`, a `ValueError` whose message
names the file (and the line where it can) and the fix; each component wraps it in its own
`ConfigError`.
"""

from __future__ import annotations

from typing import Any

import yaml

#: Settings files are a few kilobytes; a megabyte is a mistake (the wrong file) or an attack.
MAX_FILE_BYTES = 1 << 20
#: How many values aliases may add beyond the ones written out.
MAX_ALIAS_EXPANSION = 10_000


class YAMLFileError(ValueError):
    """The file cannot be read as one YAML document; the message names the file and the fix."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<: *base` then overriding a key is what merge keys are for
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base class refuses it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {first}); keep one of them",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_text(text: str, *, origin: str) -> Any:
    """The document in `text`, or YAMLFileError naming `origin`. An empty document is None."""
    loader = _StrictLoader(text)
    loader.name = origin  # marks in messages name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, origin)
        return loader.construct_document(node)
    except yaml.composer.ComposerError as exc:
        if "expected a single document" in str(exc):
            line = exc.problem_mark.line + 1 if exc.problem_mark else 0
            raise YAMLFileError(
                f"{origin}: line {line}: a second YAML document (---) starts here; a settings file holds one, "
                "so remove the separator or move the rest to its own file"
            ) from None
        raise YAMLFileError(f"{origin}: not valid YAML: {_one_line(exc)}") from None
    except yaml.YAMLError as exc:
        raise YAMLFileError(f"{origin}: not valid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise YAMLFileError(
            f"{origin}: the YAML is nested too deeply to be a settings file; write it flat "
            "(a few levels of mappings and lists)"
        ) from None
    finally:
        loader.dispose()


def load_file(path: str) -> Any:
    """The document in the file at `path`; YAMLFileError when it cannot be read or used."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YAMLFileError(f"{path}: cannot read it ({exc.strerror or exc}); give an existing YAML file") from None
    return load_bytes(data, origin=path)


def load_bytes(data: bytes, *, origin: str) -> Any:
    """The document in a file's bytes; YAMLFileError naming `origin` when they cannot be used."""
    if len(data) > MAX_FILE_BYTES:
        raise YAMLFileError(
            f"{origin}: larger than {MAX_FILE_BYTES // 1024} KiB, far more than any settings file; "
            "check that the path names the intended file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YAMLFileError(
            f"{origin}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8"
        ) from None
    return load_text(text.removeprefix("\ufeff"), origin=origin)


def _check_expansion(root: yaml.Node, origin: str) -> None:
    """Refuses aliases that multiply the document (billion laughs) or point into themselves."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    distinct = 0

    def size(node: yaml.Node) -> int:
        nonlocal distinct
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise YAMLFileError(
                f"{origin}: line {node.start_mark.line + 1}: an alias (*name) points into its own anchor; "
                "write the value out"
            )
        distinct += 1
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        sizes[key] = total
        if total - distinct > MAX_ALIAS_EXPANSION:
            raise YAMLFileError(
                f"{origin}: its anchors and aliases (&name, *name) expand to more than "
                f"{MAX_ALIAS_EXPANSION} values; write the values out instead of nesting aliases"
            )
        return total

    size(root)


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())
