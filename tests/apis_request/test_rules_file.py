"""Loading rules files: the documented format, and a clear error for each kind of mistake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apis.request import RequestError, parse_pod
from apis.translation import Per, RulesError, TranslationRules
from tests.apis_request.podspecs import limits_pod

ROOT = Path(__file__).resolve().parents[2]

GOOD_RULE = "  - name: acme\n    count: {resource: acme.example/vgpu}\n"


def rules_text(body: str) -> str:
    return f"version: 1\nrules:\n{body}"


BAD_FILES = [
    pytest.param("rules: []", "version: None is not supported", id="missing-version"),
    pytest.param("version: 2\nrules: []", "version: 2 is not supported", id="unknown-version"),
    pytest.param("version: 1\nrules: []", "expected a non-empty list", id="no-rules"),
    pytest.param("version: 1\nrule: []", "unknown field rule", id="typo-at-top-level"),
    pytest.param("[1, 2]", "expected a mapping", id="not-a-mapping"),
    pytest.param("version: 1\nrules: [\n", "not valid YAML", id="broken-yaml"),
    pytest.param(rules_text("  - count: {resource: a.example/x}\n"), "rules[0]: name: None is not a valid rule name", id="no-name"),
    pytest.param(rules_text("  - name: Acme_1\n    count: {resource: a.example/x}\n"), "'Acme_1' is not a valid rule name",
                 id="bad-name"),
    pytest.param(rules_text("  - name: koordinator\n    count: {resource: a.example/x}\n"), "reserved", id="reserved-name"),
    pytest.param(rules_text(GOOD_RULE + GOOD_RULE), "rules[1] (acme): name is used twice", id="duplicate-name"),
    pytest.param(rules_text("  - name: acme\n"), "(acme): maps nothing", id="maps-nothing"),
    pytest.param(rules_text("  - name: acme\n    cout: {resource: a.example/x}\n"), "(acme): unknown field cout", id="typo-in-rule"),
    pytest.param(rules_text("  - name: acme\n    count: {resource: gpu}\n"), "count: resource: 'gpu' is not an extended resource name",
                 id="resource-without-domain"),
    pytest.param(rules_text("  - name: acme\n    count: {resource: koordinator.sh/gpu}\n"), "Koordinator resource",
                 id="claims-koordinator-resource"),
    pytest.param(rules_text("  - name: acme\n    count: {resource: a.example/x, default: 0}\n"), "count: default: 0 is not valid",
                 id="count-default-zero"),
    pytest.param(rules_text("  - name: acme\n    core: {resource: a.example/c, per: card}\n"), "core: per: 'card' is not known",
                 id="unknown-per"),
    pytest.param(rules_text("  - name: acme\n    core: {resource: a.example/c, default: 101}\n"), "core: default: 101 is not valid",
                 id="core-default-over-100"),
    pytest.param(rules_text("  - name: acme\n    memory: {resource: a.example/m, unit: GB}\n"), "memory: unit: 'GB' is not known",
                 id="unknown-unit"),
    pytest.param(rules_text("  - name: acme\n    memory: {resource: a.example/m}\n"), "memory: unit: None is not known",
                 id="missing-unit"),
    pytest.param(rules_text("  - name: acme\n    memory: {resource: a.example/m, unit: Mi, default: 5}\n"), "memory: default",
                 id="memory-default"),
    pytest.param(rules_text("  - name: acme\n    memory: {resource: a.example/m, unit: Mi}\n    memoryRatio: {resource: a.example/m}\n"),
                 "mapped twice", id="resource-mapped-twice"),
    pytest.param(rules_text("  - name: acme\n    count: {resource: a.example/x}\n    when: {any: []}\n"), "when: lists no resource",
                 id="empty-when"),
    pytest.param(rules_text("  - name: acme\n    count: {resource: a.example/x}\n    when: {some: [a.example/x]}\n"),
                 "when: unknown field some", id="unknown-when-key"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_FILES)
def test_a_bad_rules_file_is_rejected_naming_the_rule_and_field(text: str, fragment: str) -> None:
    with pytest.raises(RulesError) as caught:
        TranslationRules.from_yaml(text, origin="rules.yaml")
    message = str(caught.value)
    assert message.startswith("rules.yaml: ")
    assert fragment in message


def test_loading_a_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(RulesError, match=re.escape(f"{missing}: cannot read the rules file")):
        TranslationRules.load(str(missing))


def test_when_defaults_to_any_resource_the_rule_maps() -> None:
    rules = TranslationRules.from_yaml(
        rules_text("  - name: acme\n    count: {resource: a.example/n}\n    memory: {resource: a.example/m, unit: Mi}\n")
    )
    (rule,) = rules.rules
    assert set(rule.when_any) == {"a.example/n", "a.example/m"}
    assert rule.memory is not None and rule.memory.per is Per.GPU


def test_when_all_requires_every_listed_resource() -> None:
    rules = TranslationRules.from_yaml(
        rules_text(
            "  - name: pair\n    when: {all: [a.example/n, a.example/m]}\n"
            "    count: {resource: a.example/n}\n    memory: {resource: a.example/m, unit: Mi}\n"
        )
    )
    assert rules.match(["a.example/n"]) is None
    matched = rules.match(["a.example/n", "a.example/m"])
    assert matched is not None and matched.name == "pair"


def test_the_first_matching_rule_wins() -> None:
    rules = TranslationRules.default()
    hami = rules.match(["nvidia.com/gpu", "nvidia.com/gpumem"])
    nvidia = rules.match(["nvidia.com/gpu"])
    assert hami is not None and hami.name == "hami"
    assert nvidia is not None and nvidia.name == "nvidia"


def test_a_resource_no_rule_is_triggered_by_is_rejected_with_the_resource_named() -> None:
    rules = TranslationRules.from_yaml(
        rules_text("  - name: acme\n    when: {any: [a.example/n]}\n    count: {resource: a.example/n}\n"
                   "    core: {resource: a.example/c}\n    memoryRatio: {resource: a.example/r, default: 100}\n")
    )
    with pytest.raises(RequestError, match=re.escape("a.example/c=50: does not trigger any translation rule on its own; add a.example/n, or remove it")):
        parse_pod(limits_pod({"a.example/c": 50}), rules=rules)


def test_a_count_without_default_is_required_once_the_rule_is_triggered() -> None:
    rules = TranslationRules.from_yaml(
        rules_text("  - name: acme\n    when: {any: [a.example/n, a.example/m]}\n    count: {resource: a.example/n}\n"
                   "    memory: {resource: a.example/m, unit: Mi}\n")
    )
    with pytest.raises(RequestError, match=r"a.example/n is missing: the acme rule needs the number of GPUs; add a.example/n"):
        parse_pod(limits_pod({"a.example/m": 100}), rules=rules)


def test_the_documented_example_rule_behaves_as_documented() -> None:
    doc = (ROOT / "docs" / "translation-rules.md").read_text()
    yaml_blocks = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    example = next(b for b in yaml_blocks if "name: acme" in b)
    rules = TranslationRules.from_yaml(example)
    request = parse_pod(
        limits_pod({"acme.example/vgpu": 2, "acme.example/vgpu-compute": 40, "acme.example/vgpu-vram": 6}), rules=rules
    )
    assert request is not None
    assert request.to_json() == {
        "gpus": 2, "core_percent": 40, "memory_bytes": 6 * 2**30, "memory_ratio_percent": None, "whole": False, "source": "acme",
    }
    whole = parse_pod(limits_pod({"acme.example/vgpu": 3}), rules=rules)
    assert whole is not None and whole.whole and whole.gpus == 3


def test_the_built_in_rules_file_ships_as_package_data() -> None:
    import importlib.resources

    assert importlib.resources.files("apis").joinpath("rules/default.yaml").is_file()
