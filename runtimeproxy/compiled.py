"""Whether the relay runs compiled (mypyc, see setup.py) or as Python, and never a stale compiled build.

A compiled module is a file beside its source (`request_pump.cpython-311-*.so`)
that Python imports in preference to the `.py`. After the source changes (a
`git pull` in a checkout installed with `pip install -e .`), it still holds
the old code. The build records a digest of the source it compiled
(`DIGEST_FILE`); `prefer_fresh` runs before any relay module is imported and,
unless the source still has that digest, loads every relay module from source
instead (all or none: compiled modules share their classes, and a compiled
pump refuses an interpreted connection's state). `FGPU_PURE_PYTHON=1` does the
same on purpose.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import sys
from typing import Final

from apis.names import PURE_PYTHON_ENV

#: The modules setup.py compiles, in import order (each imports only those before it).
MODULES: Final = ("h2frames", "hpack_codec", "relay_state", "request_pump", "response_pump", "connection")

#: The library that holds the compiled code of all of them (`fgpu_relay__mypyc.*.so`, beside the package);
#: the per-module files only load it.
LIBRARY: Final = "fgpu_relay"
#: Written by the build beside the compiled modules: `source_digest()` of the source it compiled.
DIGEST_FILE: Final = "compiled.sha256"

_HERE: Final = os.path.dirname(os.path.abspath(__file__))

#: "compiled", "python", or "python (...why...)"; set by `prefer_fresh`
build = "python"


def source_digest() -> str:
    """sha256 of the compiled modules' sources, in `MODULES` order: what a build records in `DIGEST_FILE`."""
    h = hashlib.sha256()
    for name in MODULES:
        with open(os.path.join(_HERE, f"{name}.py"), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def prefer_fresh(package: str) -> str:
    """Loads the relay from source unless its compiled build is of this very source; says which runs."""
    global build
    if not any(glob.glob(os.path.join(_HERE, f"{name}.*.so")) for name in MODULES):
        build = "python"
        return build
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        _load_source(package)
        build = f"python ({PURE_PYTHON_ENV}=1)"
        return build
    try:
        with open(os.path.join(_HERE, DIGEST_FILE)) as f:
            built = f.read().strip()
    except OSError:
        built = ""
    if built == source_digest():
        try:
            importlib.import_module(f"{package}.{MODULES[0]}")
        except ImportError as exc:  # e.g. its library missing: an install that was moved or half removed
            _load_source(package)
            build = f"python (the compiled build does not load: {exc})"
            return build
        build = "compiled"
        return build
    _load_source(package)
    build = "python (the compiled build is not of this source: pip install -e . or a reinstall rebuilds it)"
    return build


def _load_source(package: str) -> None:
    for name in MODULES:
        full = f"{package}.{name}"
        spec = importlib.util.spec_from_file_location(full, os.path.join(_HERE, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules[package], name, module)
