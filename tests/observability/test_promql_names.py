"""The metric-name reader the dashboard and alert lints rely on, on the shapes they use."""

from __future__ import annotations

import pytest

from tests.observability.promql import grafana_to_promql, metric_names

CASES = [
    ("fgpu_agent_nvml_up == 0", {"fgpu_agent_nvml_up"}),
    ('count(fgpu_agent_gpu_healthy{node=~"$node"} == 0) or vector(0)', {"fgpu_agent_gpu_healthy"}),
    (
        "histogram_quantile(0.99, sum by (le, phase) (rate(fgpu_scheduler_phase_duration_seconds_bucket[$__rate_interval])))",
        {"fgpu_scheduler_phase_duration_seconds_bucket"},
    ),
    (
        "sum by (model) (a_allocated{model=~\"x|y\"}) / on (model) group_left (node) sum by (model) (b_capacity)",
        {"a_allocated", "b_capacity"},
    ),
    ("(sum(up_total) != 1) or absent(leader)", {"up_total", "leader"}),
    ("max_over_time(x_seconds[1h:5m] offset 1d) > 1.5e3", {"x_seconds"}),
    ('label_replace(m1, "dst", "$1", "src", "(.*)") unless ignoring (pod) m2', {"m1", "m2"}),
    ('{__name__="by_name_only", job="x"}', {"by_name_only"}),
    ("topk(20, sum without (uuid) (pod_bytes)) and bool 1", {"pod_bytes"}),
    ("ns:recorded:rate5m * 100", {"ns:recorded:rate5m"}),
]


@pytest.mark.parametrize(("expr", "names"), CASES, ids=[c[0][:40] for c in CASES])
def test_reads_exactly_the_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_grafana_variables_become_plain_promql() -> None:
    assert grafana_to_promql('rate(x{node=~"$node",m=~"${model}"}[$__rate_interval])') == 'rate(x{node=~".*",m=~".*"}[5m])'
