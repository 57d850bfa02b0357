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
import sys
from typing import cast

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: The relay's hot path: the frame pumps and the state, codecs and connection they drive. Modules
#: outside this list import them as usual; a compiled class may only be subclassed here.
COMPILED = [
    "runtimeproxy/h2frames.py",
    "runtimeproxy/hpack_codec.py",
    "runtimeproxy/relay_state.py",
    "runtimeproxy/request_pump.py",
    "runtimeproxy/response_pump.py",
    "runtimeproxy/connection.py",
]


class _OptionalBuildExt(build_ext):
    """Builds the compiled relay if it can; on any failure installs pure Python instead, saying why."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a missing compiler or headers: the package still works, slower
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            print(f"fgpu: the relay is not compiled ({exc}); installing pure Python", file=sys.stderr)


def _extensions() -> list[Extension]:
    if os.environ.get("FGPU_PURE_PYTHON") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        print(f"fgpu: mypyc is not available ({exc}); installing pure Python", file=sys.stderr)
        return []
    try:
        # third-party packages need not be installed where this builds: their types are then Any
        return [cast(Extension, e) for e in mypycify(["--ignore-missing-imports", *COMPILED], opt_level="3")]
    except (Exception, SystemExit) as exc:
        print(f"fgpu: mypyc could not compile the relay ({exc}); installing pure Python", file=sys.stderr)
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": _OptionalBuildExt})
