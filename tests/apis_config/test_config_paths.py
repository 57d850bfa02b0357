"""apis.config_paths: a file a config names is absolute, or it means another file under systemd."""

from __future__ import annotations

import pytest

from apis import config_paths


@pytest.mark.parametrize("value", ["", "/etc/fgpu/x.yaml", "/"])
def test_empty_and_absolute_paths_are_kept(value: str) -> None:
    assert config_paths.absolute(value, field="f", example="/etc/x") == value


@pytest.mark.parametrize("value", ["x.yaml", "./x.yaml", "../etc/x", "~/x.yaml"])
def test_a_relative_path_is_refused_naming_field_value_and_an_absolute_example(value: str) -> None:
    with pytest.raises(config_paths.PathError) as caught:
        config_paths.absolute(value, field="fakeNvml", example="/etc/fgpu/inventory.yaml")
    message = str(caught.value)
    assert f"fakeNvml={value!r} must be an absolute path" in message and "e.g. /etc/fgpu/inventory.yaml" in message
