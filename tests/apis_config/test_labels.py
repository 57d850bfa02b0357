"""apis.labels: Kubernetes' label syntax, for selectors in config files."""

from __future__ import annotations

import pytest

from apis import labels


@pytest.mark.parametrize(
    "key",
    ["team", "T_1.x", "app.kubernetes.io/name", "example.com/team", "a" * 63, "b" * 253 + "/n", "fgpu.io/inject-scheduler"],
)
def test_valid_label_keys_have_no_problem(key: str) -> None:
    assert labels.problem_with_key(key) == ""


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "the key is empty"),
        ("/team", "the prefix before '/' is empty"),
        ("example.com/", "the name after the prefix is empty"),
        ("a/b/c", "at most one '/'"),
        ("Example.com/team", "is not a DNS subdomain"),
        ("ex_ample.com/team", "is not a DNS subdomain"),
        ("b" * 254 + "/n", "at most 253"),
        ("Team Name", "is not a label name"),
        ("-team", "is not a label name"),
        ("team.", "is not a label name"),
        ("a" * 64, "at most 63"),
    ],
)
def test_invalid_label_keys_say_what_is_wrong(key: str, says: str) -> None:
    assert says in labels.problem_with_key(key)


@pytest.mark.parametrize("value", ["", "ml", "ML_training-2.0", "7", "v" * 63])
def test_valid_label_values_have_no_problem(value: str) -> None:
    assert labels.problem_with_value(value) == ""


@pytest.mark.parametrize("value", ["machine learning", "ml-", "_ml", "a/b", "v" * 64, "é"])
def test_invalid_label_values_say_what_is_wrong(value: str) -> None:
    assert "at most 63" in labels.problem_with_value(value)
