"""The metric names a PromQL expression reads, without a PromQL library (none is maintained for Python).

Strings, label matchers (`{...}`), ranges and subqueries (`[...]`), grouping label lists
(`by (...)`, `on (...)`, `group_left (...)`), Grafana variables (`$node`, `${model}`,
`$__rate_interval`), numbers and durations go first; what is left is either a function name (an
identifier followed by `(`), a keyword, or a metric name. `{__name__="x"}` selectors are read too.
Syntax is promtool's business: the tests also have promtool parse every expression.
"""

from __future__ import annotations

import re

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
     "inf", "nan", "atan2", "start", "end"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?(?:ms|[smhdwy])*)(?![\w:])")


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects, e.g. {"fgpu_scheduler_phase_duration_seconds_bucket"}."""
    names = {a or b for a, b in _NAME_MATCHER.findall(expr)}
    text = _VARIABLE.sub(" 1m ", expr)
    text = _STRING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    for name, call in _IDENTIFIER.findall(text):
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def grafana_to_promql(expr: str) -> str:
    """A dashboard expression as plain PromQL: Grafana's interval variables become 5m, the others .*."""
    text = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return _VARIABLE.sub(".*", text)
