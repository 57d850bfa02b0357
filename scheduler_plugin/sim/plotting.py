"""Allocation ratio against arrived workload, one line per policy (like the FGD paper's figure).

matplotlib is an optional extra (`pip install fgpu[plot]`); it is imported only here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def plot_curves(curves: Mapping[str, Sequence[tuple[float, float]]], *, path: str, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib; install the extra with: pip install 'fgpu[plot]'"
        ) from exc
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for policy, points in curves.items():
        axes.plot([p[0] for p in points], [p[1] for p in points], label=policy, linewidth=1.4)
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
