"""``report.md`` and ``report.html``: system info, failed verifications first, the summary
and full tables, and the plots (linked from the Markdown, embedded in the HTML)."""

from __future__ import annotations

import base64
import html
import math
import os
from typing import Any

import pandas as pd

from hologram.bench import compile as compile_bench
from hologram.bench.results import create_summary_table, frame
from hologram.bench.runners import LOOP_MAX_MS

METHOD = (
    "Each case is verified against PyTorch (rtol/atol per case, listed in results.csv) "
    "before it is timed. PyTorch runs on {device}. Then PyTorch and Hologram are timed "
    "interleaved in one process "
    "(alternating order each round) after {warmup} warm-up calls, {timing} timed calls each, "
    "one call per sample, synchronous. Hologram's warm-up lasts until its code is the full "
    "build (the first calls of a new program run a quickly compiled one; the full build is "
    "compiled in the background). Before each sample the same call runs untimed for a "
    "few tens of ms so neither library's spinning thread pool slows the other. Times are "
    "medians; speedup = PyTorch median / Hologram median, above 1 means Hologram was faster. "
    "Fused chains also time torch.compile (speedup_vs_compile). A case is flagged when a "
    "side's median is over 3x its minimum (most samples waited for the CPU), when a win "
    "or loss has a 95% interval (from the medians' order-statistic intervals) that holds "
    "1, or when other processes used the cores its threads needed; a flagged case is "
    "timed again, up to {retries} times, after waiting up to a "
    "second for other processes to go idle, and keeps its least stalled attempt. Cases "
    "whose single calls take under {loop_ms} ms are also timed as calls in a loop "
    "(back-to-back, a few ms per sample, interleaved, medians): see 'Isolated call and "
    "call in a loop'.")


LATENCY = (
    "µs per call. 'call': one call per sample after a warm-up of the same call, as in "
    "the headline (what a program pays for an op between other work). 'loop': calls "
    "back to back (what a loop over the op pays). Both sides are timed the same way in "
    "each view.")


def _where(row: Any) -> str:
    """The flagged row's context: attempts and the load other processes put on the CPU."""
    parts = []
    attempts = getattr(row, "attempts", None)
    if attempts is not None and not pd.isna(attempts):
        parts.append(f"{int(attempts)} attempt{'s' if attempts != 1 else ''}")
    others = getattr(row, "other_load", None)
    if others is not None and not pd.isna(others):
        parts.append(f"other processes used {others:.1f} cores")
    return f" ({', '.join(parts)})" if parts else ""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def _md_table(df: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, df.columns)) + " |",
             "|" + "---|" * len(df.columns)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The per-case columns a reader needs."""
    columns = ["family", "operation", "shape", "pytorch_median_ms", "hologram_median_ms",
               "speedup", "torch_compile_median_ms", "speedup_vs_compile", "hologram_ci95_low_ms",
               "hologram_ci95_high_ms", "verified", "max_rel_err", "flag"]
    return df[[c for c in columns if c in df]]


def flagged(df: pd.DataFrame) -> pd.DataFrame:
    """The timed cases whose timings were flagged as unreliable (see
    :func:`hologram.bench.stats.unreliable`)."""
    if "flag" not in df:
        return df.iloc[:0]
    flags = df["flag"].fillna("").astype(str)
    return df[(flags != "") & df["speedup"].notna()]


def latency_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cases timed both ways: a single call per sample (the headline's numbers) and calls
    in a loop, in µs, with each view's speedup."""
    if "hologram_loop_us" not in df:
        return pd.DataFrame()
    part = df[df["hologram_loop_us"].notna()]
    return pd.DataFrame({
        "operation": part["operation"], "shape": part["shape"],
        "pytorch_call_us": part["pytorch_median_ms"] * 1e3,
        "hologram_call_us": part["hologram_median_ms"] * 1e3,
        "speedup_call": part["speedup"],
        "pytorch_loop_us": part["pytorch_loop_us"], "hologram_loop_us": part["hologram_loop_us"],
        "speedup_loop": part["speedup_loop"]})


def _load(df: pd.DataFrame) -> str:
    before = df["load_before"].dropna() if "load_before" in df else []
    after = df["load_after"].dropna() if "load_after" in df else []
    if not len(before) or not len(after):
        return "load average not recorded"
    return (f"load average {before.iloc[0]:.2f} before the cases, {after.iloc[-1]:.2f} after "
            f"(highest {max(before.max(), after.max()):.2f})")


def headline(df: pd.DataFrame) -> list[str]:
    """Counts computed from the data: who was faster, where; and a warning naming how many
    results are stalls or noise, with the machine's load, when there are any."""
    timed = df[df["speedup"].notna()]
    wins = int((timed["speedup"] > 1.05).sum())
    losses = int((timed["speedup"] < 1 / 1.05).sum())
    lines = [f"{len(df)} cases; Hologram faster (>5%) in {wins}, PyTorch faster (>5%) in "
             f"{losses}, within ±5% in {len(timed) - wins - losses}."]
    if "flag" in df:
        bad = flagged(df)
        if len(bad):
            flags = bad["flag"].astype(str)
            stalls = int(flags.str.contains("minimum").sum())
            wide = int(flags.str.contains("holds 1").sum())
            crowded = int(flags.str.contains("other processes used").sum())
            others = bad["other_load"].dropna() if "other_load" in bad else []
            busy = (f"; other processes used up to {others.max():.1f} cores while one was "
                    f"timed" if len(others) else "")
            attempts = int(bad["attempts"].max()) if "attempts" in bad else 1
            lines.append(
                f"⚠ WARNING: {len(bad)} of {len(timed)} cases flagged, their timings are not "
                f"results ({stalls} with a median over 3x its minimum, {wide} with a speedup "
                f"whose 95% interval holds 1, {crowded} timed while other processes used the "
                f"cores its threads needed), after up to {attempts} attempts each: "
                f"{int((bad['speedup'] > 1.05).sum())} of the wins and "
                f"{int((bad['speedup'] < 1 / 1.05).sum())} of the losses above. "
                f"{_load(df)}{busy}. Re-run on a quiet machine before reading them.")
        else:
            lines.append(f"No case flagged: every median within 3x its minimum, every win "
                         f"and loss outside its 95% interval; {_load(df)}.")
    for family, group in timed.groupby("family", sort=False):
        largest = group[group["size"] == group["size"].max()]
        geo = math.exp(largest["speedup"].map(math.log).mean())
        who = "Hologram" if geo > 1 else "PyTorch"
        lines.append(f"{family} at the largest size ({int(largest['size'].iloc[0]):,}): "
                     f"geometric-mean speedup {geo:.2f}x ({who} faster).")
    return lines


def write_report(records: list[dict], system: dict, plots: list[str], out_dir: str,
                 *, warmup: int, timing: int, command: str = "",
                 compiled: dict | None = None) -> tuple[str, str]:
    """Write ``report.md`` and ``report.html`` into ``out_dir``; returns their paths.
    ``compiled``: the torch.compile section's results (:mod:`hologram.bench.compile`),
    reported after the summary when given."""
    df = frame(records)
    failed = df[~df["verified"].astype(bool)]
    summary = create_summary_table(df)
    table = results_table(df)
    system_df = pd.DataFrame({"key": list(system), "value": [_fmt(v) for v in system.values()]})
    device = system.get("pytorch_device", "cpu")
    method = METHOD.format(warmup=warmup, timing=timing,
                           device="the GPU (CUDA)" if device == "cuda" else "the CPU",
                           retries=system.get("retries", 0), loop_ms=LOOP_MAX_MS)
    bad = flagged(df)
    latency = latency_table(df)
    heads = headline(df)

    md = ["# Hologram vs PyTorch benchmark report", ""]
    if command:
        md += [f"Command: `{command}`", ""]
    if len(failed):
        md += [f"## ❌ FAILED VERIFICATIONS ({len(failed)} of {len(df)} cases)", ""]
        md += [f"- **{r.operation} @ {r.size}**: {r.error}" for r in failed.itertuples()]
    else:
        md += [f"✅ All {len(df)} cases verified against PyTorch."]
    md += ["", "## Headline", ""] + [f"- {line}" for line in heads]
    if len(bad):
        md += ["", f"## ⚠ Flagged cases ({len(bad)})", ""]
        md += [f"- **{r.operation} @ {r.size}**: {r.flag}{_where(r)}" for r in bad.itertuples()]
    md += ["", "## Method", "", method, "", "## System", "", _md_table(system_df), "",
           "## Summary by operation", "", _md_table(summary), ""]
    if len(latency):
        md += ["## Isolated call and call in a loop", "", LATENCY, "", _md_table(latency), ""]
    if compiled is not None:
        md += compile_bench.markdown(compiled)
    md += ["## Plots", ""]
    md += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    md += ["", "## All cases", "", _md_table(table), ""]
    md_path = os.path.join(out_dir, "report.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))

    def h(text: str) -> str:
        return html.escape(str(text))

    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             "<title>Hologram vs PyTorch benchmark report</title><style>",
             "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}",
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
             "padding:2px 6px}.fail{background:#fdd;border:3px solid #c00;padding:0.5em}",
             ".ok{background:#dfd;padding:0.5em}img{max-width:100%}</style></head><body>",
             "<h1>Hologram vs PyTorch benchmark report</h1>"]
    if command:
        parts.append(f"<p>Command: <code>{h(command)}</code></p>")
    if len(failed):
        parts.append(f"<div class='fail'><h2>❌ FAILED VERIFICATIONS ({len(failed)} of "
                     f"{len(df)} cases)</h2><ul>")
        parts += [f"<li><b>{h(r.operation)} @ {r.size}</b>: {h(r.error)}</li>"
                  for r in failed.itertuples()]
        parts.append("</ul></div>")
    else:
        parts.append(f"<p class='ok'>✅ All {len(df)} cases verified against PyTorch.</p>")
    parts.append("<h2>Headline</h2><ul>" + "".join(f"<li>{h(x)}</li>" for x in heads)
                 + "</ul>")
    if len(bad):
        parts.append(f"<div class='fail'><h2>⚠ Flagged cases ({len(bad)})</h2><ul>")
        parts += [f"<li><b>{h(r.operation)} @ {r.size}</b>: {h(r.flag)}{h(_where(r))}</li>"
                  for r in bad.itertuples()]
        parts.append("</ul></div>")
    parts += [f"<h2>Method</h2><p>{h(method)}</p>", "<h2>System</h2>",
              system_df.to_html(index=False), "<h2>Summary by operation</h2>",
              summary.to_html(index=False, float_format=_fmt)]
    if len(latency):
        parts += ["<h2>Isolated call and call in a loop</h2>", f"<p>{h(LATENCY)}</p>",
                  latency.to_html(index=False, float_format=_fmt)]
    if compiled is not None:
        parts += compile_bench.html(compiled)
    parts.append("<h2>Plots</h2>")
    for path in plots:
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        parts.append(f"<h3>{h(os.path.basename(path))}</h3>"
                     f"<img src='data:image/png;base64,{data}'>")
    parts += ["<h2>All cases</h2>", table.to_html(index=False, float_format=_fmt),
              "</body></html>"]
    html_path = os.path.join(out_dir, "report.html")
    with open(html_path, "w") as f:
        f.write("\n".join(parts))
    return md_path, html_path
