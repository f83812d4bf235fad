"""Result records as tables: :func:`create_summary_table`, :func:`compare_results`,
:func:`compare_frameworks`, :func:`save_results`, :func:`load_results`.

A record is a flat dict (see :func:`hologram.bench.runners.compare`). Columns named
``atlas_*`` (Hologram's name in older result files) are read as ``hologram_*``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from hologram.bench.stats import BenchmarkResult


def frame(results: Any) -> pd.DataFrame:
    """A DataFrame of records (a DataFrame, or an iterable of dicts), with ``atlas_*``
    columns renamed ``hologram_*`` and ``speedup`` filled in where missing."""
    df = results.copy() if isinstance(results, pd.DataFrame) else pd.DataFrame(list(results))
    df = df.rename(columns={c: "hologram_" + c[len("atlas_"):] for c in df.columns
                            if c.startswith("atlas_")})
    if "speedup" not in df and {"pytorch_mean_ms", "hologram_mean_ms"} <= set(df.columns):
        df["speedup"] = df["pytorch_mean_ms"] / df["hologram_mean_ms"]
    if "family" not in df:
        df["family"] = ""
    if "verified" not in df:
        df["verified"] = True
    return df


def create_summary_table(results: Any) -> pd.DataFrame:
    """One row per operation: sizes run, geometric-mean / min / max speedup (PyTorch time
    over Hologram time: above 1, Hologram faster), the size where Hologram did best, cases
    verified, and who wins at the largest size."""
    df = frame(results)
    rows = []
    for (family, op), group in df.groupby(["family", "operation"], sort=False):
        group = group.sort_values("size")
        speedups = group["speedup"].dropna()
        speedups = speedups[speedups > 0]
        largest = group.iloc[-1]["speedup"]
        rows.append({
            "family": family, "operation": op, "sizes": len(group),
            "geomean_speedup": math.exp(speedups.map(math.log).mean()) if len(speedups)
            else math.nan,
            "min_speedup": speedups.min() if len(speedups) else math.nan,
            "max_speedup": speedups.max() if len(speedups) else math.nan,
            "best_size": int(group.loc[speedups.idxmax(), "size"]) if len(speedups) else None,
            "largest_size_winner": _winner(largest),
            "verified": f"{int(group['verified'].astype(bool).sum())}/{len(group)}",
        })
    return pd.DataFrame(rows)


def _winner(speedup: float) -> str:
    if math.isnan(speedup):  # Hologram failed
        return "n/a"
    if 0.95 <= speedup <= 1.05:
        return "tie (±5%)"
    return "Hologram" if speedup > 1 else "PyTorch"


def compare_results(baseline: BenchmarkResult, candidate: BenchmarkResult) -> dict:
    """How ``candidate`` compares with ``baseline``: ``speedup`` (baseline mean over
    candidate mean; above 1, candidate faster), ``median_speedup``, and ``significant``
    (the two 95% confidence intervals do not overlap)."""
    b_low, b_high = baseline.ci95_ms
    c_low, c_high = candidate.ci95_ms
    return {
        "baseline": baseline.name, "candidate": candidate.name,
        "baseline_mean_ms": baseline.mean_ms, "candidate_mean_ms": candidate.mean_ms,
        "speedup": baseline.mean_ms / candidate.mean_ms,
        "median_speedup": baseline.median_ms / candidate.median_ms,
        "significant": c_high < b_low or b_high < c_low,
        "faster": candidate.name if candidate.median_ms < baseline.median_ms
        else baseline.name,
    }


def compare_frameworks(pytorch: BenchmarkResult, hologram: BenchmarkResult,
                       name: str = "", size: int | None = None) -> dict:
    """A result record from two :class:`BenchmarkResult` s of the same case (as the
    ``benchmark_*_op`` helpers build them), for tables and plots."""
    record: dict[str, Any] = {"operation": name or hologram.name, "size": size}
    record.update(pytorch.summary("pytorch_"))
    record.update(hologram.summary("hologram_"))
    record["speedup"] = pytorch.median_ms / hologram.median_ms
    record["significant"] = compare_results(pytorch, hologram)["significant"]
    return record


def _plain(value: Any) -> Any:
    """JSON-safe scalars (NumPy numbers become Python ones, NaN becomes null)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save_results(records: Iterable[dict], path: str | os.PathLike, format: str = "json",
                 metadata: dict | None = None, sections: dict | None = None) -> str:
    """Write records as JSON (``{"system": metadata, "results": [...]}``, plus each of
    ``sections``, e.g. ``torch_compile``, under its name) or CSV (records only). Returns the
    path written."""
    rows = [{k: _plain(v) for k, v in r.items()} for r in records]
    path = os.fspath(path)
    if format == "json":
        with open(path, "w") as f:
            json.dump({"system": {k: _plain(v) for k, v in (metadata or {}).items()},
                       "results": rows, **(sections or {})}, f, indent=1)
    elif format == "csv":
        columns: list[str] = []
        for row in rows:
            columns += [k for k in row if k not in columns]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    else:
        raise ValueError(f"format must be 'json' or 'csv', got {format!r}")
    return path


def load_results(path: str | os.PathLike) -> list[dict]:
    """The records of a file :func:`save_results` wrote (JSON or CSV, by extension)."""
    path = os.fspath(path)
    if path.endswith(".csv"):
        return pd.read_csv(path).to_dict("records")
    with open(path) as f:
        data = json.load(f)
    rows: Sequence[dict] = data["results"] if isinstance(data, dict) else data
    return [{k: (math.nan if v is None else v) for k, v in row.items()} for row in rows]
