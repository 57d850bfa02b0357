from __future__ import annotations

from pathlib import Path

import pytest

KEY = b"defrag-test-key"


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "signing-key"
    path.write_bytes(KEY + b"\n")
    return str(path)
