"""Translation rules: how other GPU-sharing products' resources map onto fgpu's request.

A rule is config, not code: each names the resources that trigger it and how
they map onto the Koordinator protocol (GPU count, core percent, memory from
a unit, memory ratio), with defaults. The built-in rules (HAMi, NVIDIA device
plugin, Aliyun, Volcano, Tencent qGPU) are in `apis/rules/default.yaml`; the
format is documented in docs/translation-rules.md. Translating to Koordinator
amounts (rather than straight to a DeviceRequest) lets every pod, whatever
product it was written for, go through the one validation in apis/request_checks.py.

One rule and its mapping are in apis/translation_rule.py, the rules file and
the ordered `TranslationRules` in apis/rules_file.py, hot reload in
apis/rules_watcher.py; this module gathers their public names so that
callers import one place.

Example rule::

    - name: hami
      when: {any: [nvidia.com/gpumem, nvidia.com/gpucores]}
      count: {resource: nvidia.com/gpu, default: 1}
      core: {resource: nvidia.com/gpucores, per: gpu, default: 0}
      memory: {resource: nvidia.com/gpumem, unit: Mi, per: gpu}
"""

from __future__ import annotations

from apis.rules_file import RULES_VERSION, RulesError, TranslationRules
from apis.rules_watcher import RulesWatcher
from apis.translation_rule import (
    KOORDINATOR_SOURCE,
    CountSpec,
    Per,
    Rule,
    ShareSpec,
    Term,
    Translated,
    problem,
)

__all__ = [
    "KOORDINATOR_SOURCE",
    "RULES_VERSION",
    "CountSpec",
    "Per",
    "Rule",
    "RulesError",
    "RulesWatcher",
    "ShareSpec",
    "Term",
    "Translated",
    "TranslationRules",
    "problem",
]
