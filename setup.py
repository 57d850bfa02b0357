"""Build: the runtime proxy's frame relay compiled with mypyc, or pure Python where that cannot be done.

The proxy's relay reads every HTTP/2 frame kubelet and the runtime exchange
(docs/runtime-proxy.md). Compiled with mypyc (the same source, type-checked,
turned into a C extension), those modules take less than half the CPU per
call; that is what keeps the proxy near containerd's own throughput on a
loaded node (bench/proxy_h2load.py). Without a C compiler, or with
FGPU_PURE_PYTHON=1, the package installs as plain Python and works the same,
only slower; `fgpu-runtime-proxy` logs which one it runs
("relay build=compiled|python").
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import cast

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _ROOT)
# runtimeproxy/compiled.py (which modules, the digest of their source) imports only the standard library and
# apis/names.py: read here without importing the package, whose dependencies need not be installed to build
_compiled = runpy.run_path(os.path.join(_ROOT, "runtimeproxy", "compiled.py"))
_DIGEST = os.path.join(_ROOT, "runtimeproxy", _compiled["DIGEST_FILE"])
#: The relay's hot path: the frame pumps and the state, codecs and connection they drive. Modules
#: outside this list import them as usual; a compiled class may only be subclassed here.
COMPILED = [f"runtimeproxy/{name}.py" for name in _compiled["MODULES"]]


class _OptionalBuildExt(build_ext):
    """Builds the compiled relay if it can; on any failure installs pure Python instead, saying why."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a missing compiler or headers: the package still works, slower
            for path in [*self.get_outputs(), _DIGEST, os.path.join(self.build_lib, "runtimeproxy", _compiled["DIGEST_FILE"])]:
                if os.path.exists(path):
                    os.remove(path)
            print(f"fgpu: the relay is not compiled ({exc}); installing pure Python", file=sys.stderr)


def _extensions() -> list[Extension]:
    if os.path.exists(_DIGEST):
        os.remove(_DIGEST)
    if os.environ.get(_compiled["PURE_PYTHON_ENV"]) == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        print(f"fgpu: mypyc is not available ({exc}); installing pure Python", file=sys.stderr)
        return []
    try:
        # third-party packages need not be installed where this builds: their types are then Any
        built = mypycify(["--ignore-missing-imports", *COMPILED], opt_level="3", group_name=_compiled["LIBRARY"])
        extensions = [cast(Extension, e) for e in built]
    except (Exception, SystemExit) as exc:
        print(f"fgpu: mypyc could not compile the relay ({exc}); installing pure Python", file=sys.stderr)
        return []
    # what the compiled modules were built from: runtimeproxy.compiled runs them only for this source
    with open(_DIGEST, "w") as f:
        f.write(_compiled["source_digest"]() + "\n")
    return extensions


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
