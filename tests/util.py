"""Helpers shared by the tests: random inputs with edge values, running a program on the
reference interpreter, bit-level comparison, work on several threads at once, and the
torch device's checks in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from hologram.backends.interp import run
from hologram.isa import dtypes as dt
from hologram.isa.ir import BufferDecl, Program

FLOAT_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, -1e-40, 3.4e38, 0.5]


def random_array(buf: BufferDecl, rng: np.random.Generator, edges: bool = True) -> np.ndarray:
    """Random values for ``buf`` (storage dtype), sprinkled with edge values."""
    t, n = buf.dtype, buf.size
    if t.is_bool:
        return rng.random(n) < 0.5
    if t.is_int:
        info = np.iinfo(t.storage)
        values = rng.integers(-50 if info.min else 0, 50, n, dtype=t.storage)
        if edges and n:
            picks = rng.integers(0, n, max(1, n // 8))
            values[picks] = rng.choice([info.min, info.max, 0, -1 if info.min else 1], picks.size)
        return values
    values = rng.standard_normal(n) * 3
    if edges and n:
        picks = rng.integers(0, n, max(1, n // 6))
        values[picks] = rng.choice(FLOAT_EDGES, picks.size)
    if t is dt.bfloat16:
        return dt.to_bf16_bits(values.astype(np.float32))
    with np.errstate(over="ignore"):
        return values.astype(t.storage)


def execute(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``program`` on the interpreter; returns the out/inout arrays."""
    given = iter(inputs)
    arrays = [
        next(given).copy() if p.kind in ("in", "inout") else np.zeros(p.size, p.dtype.storage)
        for p in program.params
    ]
    run(program, arrays)
    return [a for p, a in zip(program.params, arrays) if p.kind != "in"]


def inputs_for(program: Program, seed: int = 0, edges: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_array(p, rng, edges) for p in program.params if p.kind in ("in", "inout")]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical, except that any two NaNs are equal (payloads are not preserved)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        if not np.array_equal(nan, np.isnan(b)):
            return False
        return np.array_equal(a[~nan].view(np.uint8), b[~nan].view(np.uint8))
    if a.dtype == np.uint16:  # bf16 bit patterns: compare as floats for the NaN rule
        return same_bits(dt.from_bf16_bits(a), dt.from_bf16_bits(b))
    return np.array_equal(a, b)


def errors_in_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    """Run ``work(0)`` ... ``work(count - 1)`` on threads of their own, all at once, and
    return what they raised (empty when every one returned)."""
    errors: list[BaseException] = []

    def run_one(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run_one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def in_forked_child(check: Callable[[], bool], seconds: float, what: str) -> int:
    """Run ``check()`` in a forked child and return its exit code: 0 when it returned
    true, 2 when false, 1 when it raised. A child still running after ``seconds`` is
    killed and the test fails with ``what`` hung."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
        pid = os.fork()
    if pid == 0:  # child: report through the exit status only
        status = 1
        try:
            status = 0 if check() else 2
        finally:
            os._exit(status)
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"fork child hung in {what}")
        time.sleep(0.01)


def map_kernel(module: ir.Module, kernel: str, callee: ir.Function) -> None:
    """Add ``void kernel(A* in..., R* out, i64 n)``: ``out[i] = callee(in...[i])``, to
    ``module`` (for testing IR functions through ctypes)."""
    arg_tys, ret_ty = callee.function_type.args, callee.function_type.return_type
    i64 = ir.IntType(64)
    ptrs = [t.as_pointer() for t in arg_tys] + [ret_ty.as_pointer()]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), ptrs + [i64]), kernel)
    for arg in fn.args[:-1]:
        arg.add_attribute("noalias")
    entry, body, done = (fn.append_basic_block(n) for n in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    n = fn.args[-1]
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), body, done)
    b.position_at_end(body)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    args = [b.load(b.gep(p, [i], inbounds=True)) for p in fn.args[:len(arg_tys)]]
    b.store(b.call(callee, args), b.gep(fn.args[len(arg_tys)], [i], inbounds=True))
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, n), body, done)
    b.position_at_end(done)
    b.ret_void()


ROOT = Path(__file__).resolve().parents[1]
_CHECKS = """
import json, traceback, warnings
warnings.simplefilter("ignore")
import torch, hologram_torch
from hologram_torch import memory
scope = {"torch": torch, "hologram_torch": hologram_torch, "memory": memory,
         "D": torch.device("hologram"), "BACKEND": hologram_torch.get_backend()}
results = {}
for name, code in CHECKS.items():
    try:
        exec(code, run := dict(scope))
        ok = run["ok"]
        results[name] = ok if isinstance(ok, (bool, str)) else repr(ok)
    except Exception:
        results[name] = traceback.format_exc()[-2000:]
print("@@" + json.dumps(results))
"""


def run_fresh(code: str, env: dict[str, str | None], timeout: float = 900
              ) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process (the torch device's backend and devices are
    fixed at its first tensor; a cold start: no module imported, no kernel loaded), with
    the tree on ``PYTHONPATH`` and this process's environment changed by ``env`` (None: a
    variable removed); its output captured as text."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for name, value in env.items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=timeout)


def _outcome(run: Callable, device: str):
    """``run(device)``'s result moved to the CPU, or its exception's type and message
    (warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return run(device).cpu()
        except Exception as exc:  # the error under test
            return type(exc), str(exc)


def assert_same_outcome(run: Callable, device: str = "hologram") -> None:
    """``run(device)`` (a tensor operation on the torch device) does what ``run("cpu")``
    does in PyTorch: the same values bit for bit, or an exception of the same type with
    the same message."""
    import torch

    expected, actual = _outcome(run, "cpu"), _outcome(run, device)
    if isinstance(expected, tuple):
        assert actual == expected
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def device_checks(checks: dict[str, str], env: dict[str, str | None]) -> dict[str, object]:
    """Run the snippets ``checks`` in one fresh process (:func:`run_fresh`): each sees
    ``torch``, ``hologram_torch``, ``memory`` (hologram_torch's), ``D`` (the device) and
    ``BACKEND`` (its backend's name), and sets ``ok`` (True, or what differs). Returns
    ``{name: ok, or the traceback}``."""
    proc = run_fresh(f"CHECKS = {checks!r}\n{_CHECKS}", env)
    assert proc.returncode == 0, (f"exit status {proc.returncode} (negative: a signal; "
                                  f"SIGSEGV: the host read GPU memory)\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])
