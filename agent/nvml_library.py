"""The real NVML: the `pynvml` module, imported only when a node runs without `--fake-nvml`.

One of the few modules allowed to import pynvml (an import-linter contract in pyproject.toml);
`agent.main` asks here instead of importing it itself.
"""

from __future__ import annotations

from agent.nvmlapi import NVML


def load() -> NVML:
    import pynvml

    nvml: NVML = pynvml
    return nvml
