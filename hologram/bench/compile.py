"""The torch.compile section of ``hologram bench``: ``torch.compile(backend="hologram")``
against PyTorch eager and Inductor on whole models.

The models and calls are :mod:`hologram.bench.dev.compile`'s:
the MLP (256-512-512-1, batch 64, MSE) and the token transformer (embedding, 2 encoder
layers d=64/4 heads/ff 128, head, cross-entropy; batch 16 x 32), on CPU tensors, each in
two modes: ``inference`` (``no_grad``, eval; the transformer's fused inference fast path
off for every side, as graph compilers cannot look into it) and ``training`` (one whole step:
``zero_grad``, compiled ``loss(model(x))``, backward, eager Adam). Each side is compiled
once, checked against eager, warmed (Hologram's quick first builds promoted to full ones),
then timed interleaved with the others in this process, medians, at 1 and 2 threads
(PyTorch's and Hologram's counts both set).

Compile times: the first Hologram call of each case runs on an empty program cache (a new
cache directory), so it compiles every program; a second process then makes the same first
calls on that directory (warm disk cache). Inductor's first call is reported as measured,
with whatever Inductor caches this machine holds. Without Inductor (no C++ compiler, a
failing compile) its columns say why; without torch the section says so.

``quick`` (the tests): tiny MLP sizes, 1 thread, no Inductor, no second process.

    python -m hologram.bench.compile --first-calls MODELS   # the warm process (internal)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from hologram.compiler.cache import compiler_version

FULL_MODELS = ("mlp", "transformer")
MODES = ("inference", "training")
#: Full mode's timing: about 0.6 s of samples per case and thread count (all contestants).
FULL_BUDGET_S = 0.6


@dataclass(frozen=True)
class Plan:
    """What the section runs: models, thread counts, whether Inductor and the warm second
    process run, and the model sizes (:data:`hologram.bench.dev.training.SIZES` shape)."""

    models: tuple[str, ...]
    threads: tuple[int, ...]
    inductor: bool
    warm_process: bool
    sizes: dict
    quick: bool

    @classmethod
    def make(cls, quick: bool) -> Plan:
        from hologram.bench.dev import training
        from hologram.bench.sysinfo import available_cores

        if quick:
            return cls(("mlp",), (1,), False, False, training.TINY_SIZES, True)
        threads = (1, 2) if available_cores() >= 2 else (1,)
        return cls(FULL_MODELS, threads, True, True, training.SIZES, False)


def inductor_status(torch) -> str:
    """``"available"``, or why Inductor cannot compile here (one line)."""
    try:
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x * 2 + 1)
        if not torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0)):
            return "unavailable: a trial compile gave wrong values"
    except Exception as exc:  # no C++ compiler, a broken toolchain: reported, not raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"unavailable: {type(exc).__name__}: {first[:200]}"
    finally:
        torch._dynamo.reset()
    return "available"


def run(quick: bool = False, plan: Plan | None = None) -> dict:
    """Run the section; returns ``rows`` (one per model, mode and thread count),
    ``first_calls`` (one per model and mode), ``inductor`` (its status), ``blas`` (the BLAS
    Hologram's programs call, :func:`hologram.backends.cpu.blas.describe`), ``threads``,
    ``seconds``, or ``skipped`` with the reason when it cannot run."""
    start = time.perf_counter()
    try:
        from hologram.bench.dev import cpu

        torch = cpu.import_torch()
        if torch is None:
            return {"skipped": "PyTorch is not installed"}
        import torch._dynamo  # torch.compile's front end: present in every build?
    except Exception as exc:
        return {"skipped": f"torch.compile is unavailable: {exc}"}
    plan = plan or Plan.make(quick)
    inductor = inductor_status(torch) if plan.inductor else "not run (quick mode)"
    with tempfile.TemporaryDirectory(prefix="hologram-bench-cache-") as cache_dir:
        rows = _timed_rows(torch, plan, inductor == "available", cache_dir)
        warm = _warm_process(plan, cache_dir) if plan.warm_process else {}
    if warm.pop("compiler_version", compiler_version()) != compiler_version():
        # The cache key covers the compiler's sources: edited in between, nothing matches.
        warm = {"error": "the compiler's sources changed between the two processes (the "
                         "program cache's key covers them), so the second process compiled "
                         "again: run it on an unchanged tree"}
    first_calls = []
    for row in rows:
        if row["threads"] != plan.threads[0]:
            continue
        key = f"{row['model']}/{row['mode']}"
        first_calls.append({
            "model": row["model"], "mode": row["mode"],
            "hologram_cold_s": row["first_call_s"]["hologram"],
            "hologram_backend_cold_s": row["hologram"]["backend_s"],
            "programs": row["hologram"]["programs"],
            "hologram_warm_process_s": warm.get(key, {}).get("first_call_s"),
            "hologram_backend_warm_s": warm.get(key, {}).get("backend_s"),
            "warm_disk_hits": warm.get(key, {}).get("disk_hits"),
            "inductor_s": row["first_call_s"].get("inductor")})
    return {"threads": list(plan.threads), "inductor": inductor, "blas": _blas(), "rows": rows,
            "first_calls": first_calls, "warm_process": warm.get("error", "ok" if warm else
                                                                  "not run (quick mode)"),
            "quick": plan.quick, "seconds": round(time.perf_counter() - start, 1)}


def _blas() -> str:
    """The cpu backend's BLAS as the compiled programs use it (with torch imported:
    PyTorch's MKL, docs/compile.md)."""
    try:
        from hologram.backends.cpu import blas
    except ImportError:  # a build without the cpu backend
        return "no cpu backend"
    return blas.describe()


def _timed_rows(torch, plan: Plan, inductor: bool, cache_dir: str) -> list[dict]:
    """One row per model, mode and thread count. Each side is compiled once (its programs
    into the empty ``cache_dir``), checked against eager, warmed until Hologram's quick
    builds are promoted to full ones, then timed at every thread count."""
    import warnings

    import hologram
    from hologram.bench.dev import compile as dev_compile
    from hologram.bench.dev import cpu

    settings = cpu.Settings.make(plan.quick)
    if not plan.quick:
        settings = cpu.Settings(**{**vars(settings), "budget_s": FULL_BUDGET_S})
    backends = ["eager", "hologram"] + (["inductor"] if inductor else [])
    saved = os.environ.get("HOLOGRAM_CACHE_DIR")
    threads_before = torch.get_num_threads(), hologram.get_num_threads()
    rows = []
    os.environ["HOLOGRAM_CACHE_DIR"] = cache_dir  # the program cache follows it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, model, inputs, loss_fn in dev_compile.models(torch, plan.sizes):
                if name not in plan.models:
                    continue
                for mode in MODES:
                    # The transformer's inference fast path is one fused op per layer that
                    # graph compilers cannot look into: off for every side.
                    fastpath = name == "transformer" and mode == "inference"
                    torch.backends.mha.set_fastpath_enabled(not fastpath)
                    try:
                        rows += _case(torch, plan, settings, name, model, inputs, loss_fn,
                                      mode, backends)
                    finally:
                        torch.backends.mha.set_fastpath_enabled(True)
    finally:
        if saved is None:
            os.environ.pop("HOLOGRAM_CACHE_DIR", None)
        else:
            os.environ["HOLOGRAM_CACHE_DIR"] = saved
        torch.set_num_threads(threads_before[0])
        hologram.set_num_threads(threads_before[1])
        torch._dynamo.reset()
    return rows


def _case(torch, plan: Plan, settings, name: str, model, inputs, loss_fn, mode: str,
          backends: list[str]) -> list[dict]:
    """The rows of one model and mode (see :func:`_timed_rows`)."""
    import hologram
    from hologram.bench.dev import compile as dev_compile
    from hologram.bench.dev import training
    from hologram.bench.runners import promote

    x, y = inputs

    def make(backend):
        if mode == "inference":
            return dev_compile.inference(torch, model, x, backend)
        return dev_compile.training_step(torch, model, loss_fn, x, y, backend)

    torch.set_num_threads(plan.threads[0])
    hologram.set_num_threads(plan.threads[0])
    calls, first, checks, own = {}, {}, [], {}
    for backend in backends:
        torch._dynamo.reset()
        call = make(backend)
        result, seconds, stats = dev_compile.first_call(torch, call)
        reference = make("eager")
        if mode == "inference":
            checks.append(dev_compile.agree(torch, result, reference()))
        else:  # the first loss, and the second (after one update)
            checks += [dev_compile.agree(torch, result, reference()),
                       dev_compile.agree(torch, call(), reference())]
        calls[backend], first[backend] = call, round(seconds, 3)
        if backend == "hologram":
            own = stats
    promote(calls["hologram"])
    names = list(calls)
    rows = []
    for n in plan.threads:
        torch.set_num_threads(n)
        hologram.set_num_threads(n)
        medians, _ = training._interleaved([calls[k] for k in names], settings)
        rows.append({"model": name, "mode": mode, "threads": n,
                     "ms": {k: round(us / 1e3, 3) for k, us in zip(names, medians)},
                     "first_call_s": first, "hologram": own,
                     "check": "ok" if all(checks) else "MISMATCH"})
    return rows


def _warm_process(plan: Plan, cache_dir: str) -> dict:
    """The first calls of a new process whose program cache is ``cache_dir``: ``{"model/
    mode": {"first_call_s", "backend_s", "disk_hits"}}``, or ``{"error": ...}``."""
    env = {**os.environ, "HOLOGRAM_CACHE_DIR": cache_dir}
    command = [sys.executable, "-m", "hologram.bench.compile", "--first-calls",
               ",".join(plan.models)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"the second process failed ({done.returncode}): {tail}"}
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return {"error": f"the second process failed: {exc}"}


def first_calls(models: tuple[str, ...]) -> dict:
    """The second process's part: each model's and mode's first Hologram call, 1 thread."""
    import warnings

    import hologram
    from hologram.bench.dev import compile as dev_compile
    from hologram.bench.dev import cpu, training

    torch = cpu.import_torch()
    torch.set_num_threads(1)
    hologram.set_num_threads(1)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model, (x, y), loss_fn in dev_compile.models(torch, training.SIZES):
            if name not in models:
                continue
            for mode in MODES:
                torch._dynamo.reset()
                if mode == "inference":
                    call = dev_compile.inference(torch, model, x, "hologram")
                else:
                    call = dev_compile.training_step(torch, model, loss_fn, x, y, "hologram")
                if name == "transformer" and mode == "inference":
                    torch.backends.mha.set_fastpath_enabled(False)
                try:
                    _, seconds, own = dev_compile.first_call(torch, call)
                finally:
                    torch.backends.mha.set_fastpath_enabled(True)
                out[f"{name}/{mode}"] = {"first_call_s": round(seconds, 3),
                                         "backend_s": own["backend_s"],
                                         "disk_hits": own["disk_hits"]}
    out["compiler_version"] = compiler_version()
    return out


# --- the report's section --------------------------------------------------------------

def _ratio(other, hologram) -> str:
    return f"{other / hologram:.2f}" if other and hologram else "—"


def tables(section: dict) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(timing header, timing rows, first-call header, first-call rows) as text cells."""
    head = ["model", "mode", "threads", "eager ms", "hologram ms", "inductor ms",
            "eager / hologram", "inductor / hologram", "check"]
    rows = []
    for r in section.get("rows", []):
        ms = r["ms"]
        eager, hg, ind = ms.get("eager"), ms.get("hologram"), ms.get("inductor")
        rows.append([r["model"], r["mode"], str(r["threads"]), f"{eager:.3f}", f"{hg:.3f}",
                     f"{ind:.3f}" if ind else "—", _ratio(eager, hg), _ratio(ind, hg),
                     r["check"]])
    first_head = ["model", "mode", "hologram first call s (cold cache)", "hologram backend s",
                  "programs", "second process first call s (warm disk cache)",
                  "second process backend s", "disk hits", "inductor first call s"]
    first = []
    for f in section.get("first_calls", []):
        def cell(value):
            return "—" if value is None else str(value)
        first.append([f["model"], f["mode"], cell(f["hologram_cold_s"]),
                      cell(f["hologram_backend_cold_s"]), cell(f["programs"]),
                      cell(f["hologram_warm_process_s"]), cell(f["hologram_backend_warm_s"]),
                      cell(f["warm_disk_hits"]), cell(f["inductor_s"])])
    return head, rows, first_head, first


def notes(section: dict) -> list[str]:
    """The section's method and status lines."""
    if "skipped" in section:
        return [f"Not run: {section['skipped']}."]
    lines = [
        "torch.compile(model, backend='hologram') against the same model in PyTorch eager "
        "and compiled by Inductor (torch.compile's default backend), in one process, "
        "interleaved, medians of ms per call; ratios above 1 mean Hologram was faster. "
        "Inference: model(x) under no_grad, eval mode (the transformer's fused inference "
        "fast path off). Training: one step, zero_grad + compiled loss(model(x)) + backward "
        "+ eager Adam. Every compiled side was checked against eager first (check).",
        f"Inductor: {section['inductor']}.",
        f"Hologram's BLAS: {section.get('blas', 'not recorded')}.",
        "First calls: Hologram's on an empty program cache (every program compiled), then "
        "a second process on that cache directory (warm disk cache; dynamo and AOTAutograd "
        "still trace); Inductor's as measured, with whatever caches of its own this machine "
        f"holds. Second process: {section['warm_process']}.",
        f"Section time: {section['seconds']} s."]
    if section.get("quick"):
        lines.append("Quick mode: tiny MLP, 1 thread, no Inductor, no second process; the "
                     "numbers say little.")
    return lines


def markdown(section: dict) -> list[str]:
    """The section's lines of report.md."""
    out = ["## torch.compile: whole models", ""] + [f"- {line}" for line in notes(section)]
    if "skipped" in section:
        return out + [""]
    head, rows, first_head, first = tables(section)
    for header, body in ((head, rows), (first_head, first)):
        out += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(row) + " |" for row in body]
    return out + [""]


def html(section: dict) -> list[str]:
    """The section's parts of report.html."""
    from html import escape

    out = ["<h2>torch.compile: whole models</h2><ul>"]
    out += [f"<li>{escape(line)}</li>" for line in notes(section)] + ["</ul>"]
    if "skipped" in section:
        return out
    head, rows, first_head, first = tables(section)
    for header, body in ((head, rows), (first_head, first)):
        out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                for row in body]
        out.append("</table>")
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--first-calls":
        raise SystemExit("usage: python -m hologram.bench.compile --first-calls MODEL[,MODEL]")
    print(json.dumps(first_calls(tuple(args[1].split(",")))))


if __name__ == "__main__":
    main()
