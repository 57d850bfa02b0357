"""Whether the relay runs compiled (mypyc, see setup.py) or as Python, and never a stale compiled build.

A compiled module is a file beside its source (`request_pump.cpython-311-*.so`)
that Python imports in preference to the `.py`, and that loads the code of all
of them from one library beside the package (`<hash>__mypyc.*.so`). After the source changes
(a `git pull` in a checkout installed with `pip install -e .`), that file
still holds the old code. `prefer_fresh` runs before any relay module is
imported: if a compiled module is older than its source, every relay module
is loaded from source instead (all or none: compiled modules share their
classes, and a compiled pump refuses an interpreted connection's state).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Final

#: The modules setup.py compiles, in import order (each imports only those before it).
MODULES: Final = ("h2frames", "hpack_codec", "relay_state", "request_pump", "response_pump", "connection")

_HERE: Final = os.path.dirname(os.path.abspath(__file__))

#: "compiled", "python", or "python (...why...)"; set by `prefer_fresh`
build = "python"


def _compiled_file(name: str) -> str | None:
    found = sorted(glob.glob(os.path.join(_HERE, f"{name}.*.so")))
    return found[0] if found else None


def prefer_fresh(package: str) -> str:
    """Loads the relay from source when its compiled build is older than the source; says which runs."""
    global build
    files = {name: _compiled_file(name) for name in MODULES}
    if not any(files.values()):
        build = "python"
        return build
    # the code itself is in one library beside the package (`<hash>__mypyc.*.so`), which a build
    # rewrites whenever a source changed; the per-module files only load it and may stay as they were
    libraries = glob.glob(os.path.join(os.path.dirname(_HERE), "*__mypyc.*.so"))
    built = max((os.path.getmtime(p) for p in libraries), default=0.0)
    stale = [
        name for name, so in files.items()
        if so is None or os.path.getmtime(os.path.join(_HERE, f"{name}.py")) > built
    ]
    if not stale:
        build = "compiled"
        return build
    for name in MODULES:
        full = f"{package}.{name}"
        spec = importlib.util.spec_from_file_location(full, os.path.join(_HERE, f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules[package], name, module)
    build = f"python (the compiled build is older than {', '.join(stale)}.py: pip install -e . rebuilds it)"
    return build
