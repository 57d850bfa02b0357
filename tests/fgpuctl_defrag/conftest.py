from __future__ import annotations

from pathlib import Path

import pytest

from tests.signing_keys import signing_key, write_signing_key

KEY = signing_key("defrag-test-key")


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    return write_signing_key(str(tmp_path / "signing-key"), KEY)
