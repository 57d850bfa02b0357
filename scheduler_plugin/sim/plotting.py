"""Allocation ratio against arrived workload, one line per policy (like the FGD paper's figure).

One figure style for the simulator's `--plot` and `fgpuctl ui`'s history charts: `line_chart_svg`
draws the SVG both use (no dependency); a `--plot` path ending in `.png` is drawn by matplotlib
in the same palette. matplotlib is an optional extra (`pip install fgpu[plot]`); it is imported only here.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

#: series colours, in order (shared by the SVG and the matplotlib figure)
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def line_chart_svg(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    *,
    x_label: str,
    y_label: str,
    x_range: tuple[float, float],
    y_range: tuple[float, float] = (0.0, 100.0),
    title: str = "",
    diagonal: bool = False,
    width: int = 640,
    height: int = 300,
) -> str:
    """An inline SVG line chart: grid, axes, one polyline per series, legend (labels are escaped)."""
    left, right, top, bottom = 52, 12, 24 if title else 10, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    (x0, x1), (y0, y1) = x_range, y_range
    x_span, y_span = (x1 - x0) or 1.0, (y1 - y0) or 1.0

    def px(x: float) -> float:
        return left + (x - x0) / x_span * plot_w

    def py(y: float) -> float:
        return top + plot_h - (min(max(y, y0), y1) - y0) / y_span * plot_h

    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
    ]
    if title:
        out.append(f'<text x="{width / 2:.0f}" y="15" text-anchor="middle" font-size="12">{html.escape(title)}</text>')
    for k in range(5):
        y = y0 + y_span * k / 4
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        x = x0 + x_span * k / 4
        out.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{x:.4g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">{html.escape(x_label)}</text>')
    out.append(
        f'<text transform="translate(12 {top + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle">{html.escape(y_label)}</text>'
    )
    if diagonal:
        out.append(
            f'<line x1="{px(x0):.1f}" y1="{py(x0):.1f}" x2="{px(x1):.1f}" y2="{py(x1):.1f}" '
            'stroke="grey" stroke-dasharray="2 3"/>'
        )
    for k, (name, points) in enumerate(curves.items()):
        colour = PALETTE[k % len(PALETTE)]
        drawn = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points if y == y)  # y != y: NaN, not sampled
        if drawn:
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{drawn}"/>')
        if len(points) < 3:  # too few for a line to show: mark the points
            out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in points if y == y)
        ly = top + 12 + 14 * k
        out.append(f'<line x1="{left + 8}" x2="{left + 24}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{left + 28}" y="{ly}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def plot_curves(curves: Mapping[str, Sequence[tuple[float, float]]], *, path: str, title: str = "") -> None:
    if path.lower().endswith(".svg"):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(
                line_chart_svg(
                    {**curves},
                    x_label="arrived workload (% of GPU capacity)",
                    y_label="GPU allocation ratio (%)",
                    x_range=(0.0, max([100.0, *(x for points in curves.values() for x, _ in points)])),
                    title=title,
                    diagonal=True,
                )
            )
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib for a .png; install the extra with: pip install 'fgpu[plot]', or give a .svg path"
        ) from exc
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for k, (policy, points) in enumerate(curves.items()):
        axes.plot(
            [p[0] for p in points], [p[1] for p in points], label=policy, linewidth=1.4, color=PALETTE[k % len(PALETTE)]
        )
    axes.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8, label="ideal")
    axes.axvline(100, color="grey", linewidth=0.6)
    axes.set_xlabel("arrived workload (% of GPU capacity)")
    axes.set_ylabel("GPU allocation ratio (%)")
    if title:
        axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)

