"""Plots of result records (matplotlib, imported on first use with the Agg backend unless
a backend is already active, as in a notebook). Each ``plot_*`` draws on ``ax`` (a new
figure when None) and returns the axes; :func:`save_plots` writes the report's PNGs.

Times are medians where the records have them (means otherwise, as in records built by
hand), with ± one standard deviation; ``speedup`` is PyTorch's time over Hologram's, so
above 1 (green) means Hologram was faster and below 1 (red) means PyTorch was.
"""

from __future__ import annotations

import math
import os
from typing import Any

from hologram.bench.results import frame

COLORS = {"pytorch": "#ee4c2c", "hologram": "#3465a4", "torch_compile": "#8a5a00"}
LABELS = {"pytorch": "PyTorch eager", "hologram": "Hologram", "torch_compile": "torch.compile"}


def _plt():
    import matplotlib

    if "matplotlib.pyplot" not in __import__("sys").modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax):
    if ax is None:
        _, ax = _plt().subplots(figsize=(8, 5))
    return ax


def _time(df, side: str) -> str:
    return f"{side}_median_ms" if f"{side}_median_ms" in df else f"{side}_mean_ms"


def _sides(df) -> list[str]:
    sides = ["pytorch", "hologram"]
    if _time(df, "torch_compile") in df and df[_time(df, "torch_compile")].notna().any():
        sides.append("torch_compile")
    return sides


def _size_label(size: Any) -> str:
    size = int(size)
    for unit, scale in (("M", 10**6), ("k", 10**3)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def plot_comparison(df: Any, operation: str, ax=None):
    """Grouped bars: each framework's time for ``operation`` at each size (log scale)."""
    data = frame(df)
    data = data[data["operation"] == operation].sort_values("size")
    ax = _axes(ax)
    sides = _sides(data)
    width = 0.8 / len(sides)
    xs = range(len(data))
    for i, side in enumerate(sides):
        std = data.get(f"{side}_std_ms")
        ax.bar([x + (i - (len(sides) - 1) / 2) * width for x in xs], data[_time(data, side)],
               width, yerr=std, capsize=2, label=LABELS[side], color=COLORS[side])
    for x, (_, row) in zip(xs, data.iterrows()):
        if not bool(row.get("verified", True)):
            ax.annotate("✗ FAILED", (x, 0.02), xycoords=("data", "axes fraction"),
                        ha="center", color="red", fontweight="bold")
    ax.set_xticks(list(xs), [_size_label(s) for s in data["size"]])
    ax.set_yscale("log")
    ax.set_xlabel("size (elements; N for GEMM)")
    ax.set_ylabel("time per call (ms, log)")
    ax.set_title(operation)
    ax.legend(fontsize="small")
    return ax


def plot_scaling(df: Any, operation: str | None = None, ax=None):
    """Time against size on log-log axes, one line per framework (per operation and
    framework when ``operation`` is None)."""
    data = frame(df)
    ops = [operation] if operation else list(dict.fromkeys(data["operation"]))
    ax = _axes(ax)
    for op in ops:
        part = data[data["operation"] == op].sort_values("size")
        for side in _sides(part):
            label = LABELS[side] if operation else f"{op} ({LABELS[side]})"
            style = "-" if side == "hologram" else ("--" if side == "pytorch" else ":")
            ax.plot(part["size"], part[_time(part, side)], style, marker="o", markersize=3,
                    label=label, color=COLORS[side] if operation else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size")
    ax.set_ylabel("time per call (ms)")
    ax.set_title(f"scaling: {operation}" if operation else "scaling")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2 if len(ops) > 3 else 1)
    return ax


def plot_speedup(df: Any, ax=None, size: int | None = None):
    """Horizontal bars, one per operation and size (only ``size`` when given): PyTorch time
    over Hologram time on a log axis, with 1 marked; cases flagged as unreliable (a
    ``flag`` in the record) in grey, marked."""
    data = frame(df).sort_values(["family", "operation", "size"], kind="stable")
    if size is not None:
        data = data[data["size"] == size]
    data = data[data["speedup"].notna()]
    ax = _axes(ax)
    labels = [f"{r.operation} @ {_size_label(r.size)}" for r in data.itertuples()]
    values = list(data["speedup"])
    # A flagged case's timings are stalls or noise, not a result: grey, marked ⚠.
    flags = list(data["flag"].fillna("").astype(str) != "") if "flag" in data \
        else [False] * len(values)
    colors = ["#999999" if bad else "#4e9a06" if v > 1 else "#cc0000"
              for v, bad in zip(values, flags)]
    ax.barh(range(len(values)), values, color=colors)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(values)), labels, fontsize=7 if len(values) > 30 else 9)
    ax.invert_yaxis()
    ax.set_xlabel("speedup = PyTorch time / Hologram time (>1: Hologram faster)")
    ax.set_title("Hologram vs PyTorch eager")
    for y, (v, bad) in enumerate(zip(values, flags)):
        ax.annotate(f"{v:.2f}x" + (" ⚠ flagged" if bad else ""), (v, y), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=6)
    return ax


def plot_heatmap(df: Any, metric: str = "speedup", ax=None):
    """Operations × sizes, colored by ``metric`` (speedup: log scale centered on 1, green
    where Hologram is faster), each cell annotated; failed verifications are marked ✗."""
    import numpy as np

    data = frame(df)
    pivot = data.pivot_table(index="operation", columns="size", values=metric, aggfunc="first",
                             sort=False)
    failed = data.pivot_table(index="operation", columns="size", values="verified",
                              aggfunc=lambda v: not all(bool(x) for x in v), sort=False)
    ax = _axes(ax)
    values = pivot.to_numpy(dtype=float)
    if metric.startswith("speedup"):
        finite = values[np.isfinite(values) & (values > 0)]
        span = max(abs(math.log10(finite.min())), abs(math.log10(finite.max())), 0.1) \
            if finite.size else 1.0
        from matplotlib.colors import LogNorm

        image = ax.imshow(values, cmap="RdYlGn", aspect="auto",
                          norm=LogNorm(10 ** -span, 10 ** span))
    else:
        image = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.figure.colorbar(image, ax=ax, label=metric)
    ax.set_xticks(range(pivot.shape[1]), [_size_label(s) for s in pivot.columns])
    ax.set_yticks(range(pivot.shape[0]), list(pivot.index))
    for i, op in enumerate(pivot.index):
        for j, size in enumerate(pivot.columns):
            value = values[i, j]
            if not math.isnan(value):
                bad = bool(failed.loc[op, size]) if size in failed.columns else False
                text = f"{value:.2f}" + (" ✗" if bad else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="black", fontweight="bold" if bad else "normal")
    ax.set_xlabel("size")
    ax.set_title(f"{metric} by operation and size")
    return ax


def save_plots(df: Any, out_dir: str | os.PathLike) -> list[str]:
    """Write the report's PNGs into ``out_dir``: ``comparison_<family>.png`` (one panel per
    operation), ``speedup.png``, ``scaling.png`` and ``heatmap.png``. Returns the paths."""
    plt = _plt()
    data = frame(df)
    out = os.fspath(out_dir)
    paths = []
    for family in dict.fromkeys(data["family"]):
        ops = list(dict.fromkeys(data[data["family"] == family]["operation"]))
        cols = min(3, len(ops))
        rows = math.ceil(len(ops) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
        for ax, op in zip(axes.flat, ops):
            plot_comparison(data, op, ax=ax)
        for ax in list(axes.flat)[len(ops):]:
            ax.set_visible(False)
        fig.suptitle(f"{family}: time per call (lower is better)")
        paths.append(_save(fig, os.path.join(out, f"comparison_{family or 'all'}.png")))
    count = int(data["speedup"].notna().sum())
    fig, ax = plt.subplots(figsize=(10, max(4, 0.22 * count + 1.5)))
    plot_speedup(data, ax=ax)
    paths.append(_save(fig, os.path.join(out, "speedup.png")))
    families = list(dict.fromkeys(data["family"]))
    cols = min(3, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.5 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        plot_scaling(data[data["family"] == family], ax=ax)
        ax.set_title(f"scaling: {family}")
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    paths.append(_save(fig, os.path.join(out, "scaling.png")))
    ops = data["operation"].nunique()
    fig, ax = plt.subplots(figsize=(2 + 1.3 * data["size"].nunique(), 1.5 + 0.4 * ops))
    plot_heatmap(data, "speedup", ax=ax)
    paths.append(_save(fig, os.path.join(out, "heatmap.png")))
    return paths


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path
