"""hologram.bench: statistics on synthetic timings, verification, the notebook helpers, and
a quick `hologram bench` run writing every artifact."""

from __future__ import annotations

import json
import math
import os
import statistics

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
torch = pytest.importorskip("torch")

import hologram as hg  # noqa: E402
from hologram import bench  # noqa: E402
from hologram.bench.stats import BenchmarkResult, t_quantile_95  # noqa: E402


def test_statistics_on_synthetic_timings():
    samples = [1.0, 2.0, 3.0, 4.0, 10.0]
    r = BenchmarkResult("synthetic", samples)
    assert r.mean_ms == 4.0
    assert r.median_ms == 3.0
    assert r.min_ms == 1.0 and r.max_ms == 10.0
    assert math.isclose(r.std_ms, statistics.stdev(samples))
    low, high = r.ci95_ms
    half = 2.776 * statistics.stdev(samples) / math.sqrt(5)  # t(0.975, 4 dof)
    assert math.isclose(low, 4.0 - half) and math.isclose(high, 4.0 + half)
    assert r.summary("x_")["x_runs"] == 5
    one = BenchmarkResult("one", [2.5])
    assert one.std_ms == 0.0 and one.ci95_ms == (2.5, 2.5)
    assert t_quantile_95(1000) == 1.96


def test_median_interval_and_stall_flags():
    from hologram.bench.stats import median_ci95, unreliable

    # n = 20: the order statistics 6 and 15 (P(Binomial(20, 1/2) <= 5) = 0.021)
    assert median_ci95([float(i) for i in range(1, 21)]) == (6.0, 15.0)
    assert median_ci95([3.0, 1.0, 2.0]) == (1.0, 3.0)
    steady = BenchmarkResult("pytorch", [1.0 + 0.01 * (i % 3) for i in range(20)])
    fast = BenchmarkResult("hologram", [0.5 + 0.01 * (i % 3) for i in range(20)])
    assert unreliable(steady, fast) == []
    # most samples waited: the median is 8x the minimum
    stalled = BenchmarkResult("hologram", [0.5] * 5 + [4.0] * 15)
    assert unreliable(steady, stalled)[0].startswith("hologram median 8.0x")
    # a 1.2x "win" from samples that spread over 0.5-2x: the interval holds 1
    noisy = BenchmarkResult("hologram", [0.5, 2.0] * 10)
    assert "holds 1" in unreliable(BenchmarkResult("pytorch", [1.5] * 20), noisy)[-1]
    # a tie is not a claim, however wide its interval
    assert unreliable(BenchmarkResult("pytorch", [1.25] * 20), noisy) == []


def test_time_pair_warms_the_sync_with_the_call():
    calls = []
    bench.time_pair([lambda: calls.append("f")], warmup_runs=0, timing_runs=2,
                    syncs=[lambda: calls.append("s")], warm_s=1e-9)
    # each sample: at least one warm-up call and its sync, then the timed call and its sync
    assert calls[:4] == ["f", "s", "f", "s"] and calls[-2:] == ["f", "s"]
    assert calls == ["f", "s"] * (len(calls) // 2)


def test_unreliable_cases_are_timed_again_and_flagged(monkeypatch):
    from hologram.bench import runners

    clean = [BenchmarkResult("pytorch", [1.0] * 10), BenchmarkResult("hologram", [0.5] * 10)]
    stalled = [BenchmarkResult("pytorch", [1.0] * 10),
               BenchmarkResult("hologram", [0.5] * 3 + [4.0] * 7)]
    attempts = []

    def fake_time_pair(fns, *args, **kwargs):
        attempts.append(1)
        return plan.pop(0)

    monkeypatch.setattr(runners, "time_pair", fake_time_pair)
    monkeypatch.setattr(runners, "wait_for_quiet", lambda limit: 0.0)
    monkeypatch.setattr(runners, "OtherLoad", Idle)
    x = np.ones(8, np.float32)
    kw = dict(executor=runners.default_executor(), loop=None)
    plan = [stalled, clean]
    record = runners.compare("neg", 8, torch.neg, hg.ops.vector_neg, [x], retries=2, **kw)
    assert record["attempts"] == 2 and record["flag"] == "" and record["speedup"] == 2.0
    # never clean: the least stalled attempt is kept, flagged
    worse = [stalled[0], BenchmarkResult("hologram", [0.5] + [4.0] * 9)]
    plan = [worse, stalled, worse]
    record = runners.compare("neg", 8, torch.neg, hg.ops.vector_neg, [x], retries=2, **kw)
    assert record["attempts"] == 3 and "hologram median 8.0x" in record["flag"]
    assert not math.isnan(record["load_before"] + record["load_after"])
    plan = [stalled]
    record = runners.compare("neg", 8, torch.neg, hg.ops.vector_neg, [x], retries=0, **kw)
    assert record["attempts"] == 1 and record["flag"] and len(attempts) == 6
    # clean timings taken while other processes held the cores the threads needed
    monkeypatch.setattr(runners, "OtherLoad", Busy)
    plan = [clean, clean]
    record = runners.compare("neg", 8, torch.neg, hg.ops.vector_neg, [x], retries=1, **kw)
    assert record["attempts"] == 2 and "other processes used" in record["flag"]


def test_other_load_is_unknown_over_a_window_of_a_few_ticks():
    from hologram.bench.sysinfo import OtherLoad

    assert OtherLoad().cores() is None  # one 10 ms tick over 1 ms would read as 10 cores


class Idle:
    def cores(self) -> float:
        return 0.0


class Busy:
    def cores(self) -> float:
        return float(os.cpu_count())


def test_the_headline_warns_of_flagged_cases():
    from hologram.bench.report import headline
    from hologram.bench.results import frame

    rows = [{"operation": op, "size": 10, "family": "elementwise", "speedup": speedup,
             "flag": flag, "attempts": 3, "other_load": 1.2, "load_before": 0.5,
             "load_after": 1.8}
            for op, speedup, flag in [("add", 1.5, ""), ("mul", 1971.0, "pytorch median "
                                                                       "230.0x its minimum")]]
    lines = headline(frame(rows))
    assert "1 of 2 cases flagged" in lines[1] and "1 of the wins" in lines[1]
    assert "load average 0.50 before the cases, 1.80 after" in lines[1]
    assert "1.2 cores" in lines[1]
    rows[1]["flag"] = ""
    assert headline(frame(rows))[1].startswith("No case flagged")


def test_benchmark_operation_warms_then_times():
    calls = []
    r = bench.benchmark_operation(lambda: calls.append(1) or len(calls), warmup_runs=5,
                                  timing_runs=12, name="count")
    assert len(calls) == 17 and r.runs == 12 and r.output == 17
    with pytest.raises(ValueError):
        bench.benchmark_operation(lambda: None, warmup_runs=1, timing_runs=0)


def test_time_pair_interleaves():
    order = []
    bench.time_pair([lambda: order.append("a"), lambda: order.append("b")], warmup_runs=0,
                    timing_runs=3)
    assert order == ["a", "b", "b", "a", "a", "b"]


def test_verify_correctness_catches_a_mismatch():
    expected = np.arange(10, dtype=np.float32)
    ok = bench.verify_correctness(expected + 1e-9, expected, name="same")
    assert ok and ok.max_abs_err < 1e-6
    wrong = expected.copy()
    wrong[3] += 0.5
    with pytest.raises(bench.VerificationError) as info:
        bench.verify_correctness(wrong, torch.from_numpy(expected), rtol=1e-5, atol=1e-8,
                                 name="case_x")
    message = str(info.value)
    assert "case_x" in message and "max abs err 5.000e-01" in message and "1 of 10" in message
    assert isinstance(info.value, AssertionError) and isinstance(info.value, hg.HologramError)
    result = bench.verify_correctness(wrong, expected, raise_on_error=False, name="case_x")
    assert not result.ok and result.mismatched == 1
    shape = bench.verify_correctness(expected[:5], expected, raise_on_error=False)
    assert not shape.ok and "shape" in shape.message
    nan = np.array([np.nan, 1.0])
    assert bench.verify_correctness(nan, nan.copy())


def test_system_info_has_every_key_the_notebooks_print():
    info = bench.collect_system_info()
    for key in ("platform", "python_version", "cpu_model", "cpu_cores_physical",
                "cpu_cores_logical", "cpu_freq_mhz", "memory_total_gb", "numpy_version",
                "torch_version", "torch_num_threads", "hologram_version", "timestamp"):
        assert key in info, key
    assert info["hologram_version"] == hg.__version__
    f"{info['cpu_freq_mhz']:.0f} {info['memory_total_gb']:.1f}"  # the notebooks' formats


def test_notebook_helpers_record_and_flag_failures(capsys):
    results = []
    bench.benchmark_elementwise_op("abs", torch.abs, [100, 1000], warmup=1, timing=3,
                                   results_list=results, verbose=False)
    assert [r["size"] for r in results] == [100, 1000]
    assert all(r["verified"] and r["speedup"] > 0 for r in results)
    # A Hologram op that computes the wrong thing is recorded and printed, not hidden.
    bad = bench.benchmark_elementwise_op("wrong", torch.neg, [64], warmup=1, timing=3,
                                         hologram_op=hg.ops.vector_abs)
    assert not bad[0]["verified"] and "MISMATCH" in bad[0]["error"]
    assert "VERIFICATION FAILED" in capsys.readouterr().out
    mm = bench.benchmark_matmul_op([16], warmup=1, timing=3, verbose=False)
    assert mm[0]["verified"]
    with pytest.raises(ValueError, match="hologram_op"):
        bench.benchmark_elementwise_op("x", torch.cos, [8], verbose=False)


def test_unusable_hologram_device_is_a_clear_error():
    # A device type torch knows but cannot allocate on here: 'hologram' itself works once any
    # test in this process has imported hologram_torch.
    with pytest.raises(bench.TorchDeviceUnavailableError, match="hologram_device=None"):
        bench.benchmark_elementwise_op("abs", torch.abs, [8], hologram_device="xla:0",
                                       verbose=False)


def test_notebook_helpers_run_on_the_hologram_device():
    pytest.importorskip("hologram_torch")
    import torch.nn.functional as F

    dev = torch.device("hologram:0")
    common = dict(warmup=1, timing=3, hologram_device=dev, verbose=False)
    seen = []

    def spy_neg(x):
        seen.append(x.device.type)
        return torch.neg(x)

    records = bench.benchmark_elementwise_op("neg", spy_neg, [100, 1000], **common)
    # The same op runs as the CPU reference, then on device tensors (verified, then timed
    # against itself on CPU).
    assert seen[:2] == ["cpu", "hologram"] and set(seen) == {"cpu", "hologram"}
    bench.benchmark_reduction_op("sum", torch.sum, [1000], rtol=1e-4, atol=1e-3,
                                 results_list=records, **common)
    bench.benchmark_matmul_op([16], results_list=records, **common)
    bench.benchmark_loss_op("mse", F.mse_loss, [100], rtol=1e-4, atol=1e-6,
                            results_list=records, **common)
    assert [r["operation"] for r in records] == ["neg", "neg", "sum", "gemm", "mse"]
    for r in records:
        assert r["verified"], r["error"]
        assert r["backend"] == "hologram:0" and r["speedup"] > 0
        assert r["fallback_ops"] == "", r  # these ops have hologram kernels
    # A device result that differs from CPU torch's is flagged.
    wrong = bench.benchmark_elementwise_op(
        "wrong", lambda x: torch.abs(x) if x.device.type == "hologram" else torch.neg(x), [64],
        **common)
    assert not wrong[0]["verified"] and "MISMATCH" in wrong[0]["error"]


def test_device_records_name_ops_that_fell_back_to_the_cpu():
    hologram_torch = pytest.importorskip("hologram_torch")

    # A custom op with only a CPU kernel always takes the device's CPU fallback.
    @torch.library.custom_op("hologram_bench_test::twice", mutates_args=(), device_types="cpu")
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.warns(hologram_torch.FallbackWarning):
        records = bench.benchmark_elementwise_op("twice", twice, [32], warmup=1, timing=2,
                                                 hologram_device="hologram:0", verbose=False)
    assert records[0]["verified"]
    assert records[0]["fallback_ops"] == "hologram_bench_test.twice.default"


def test_tables_and_save_load(tmp_path):
    records = [{"operation": "add", "size": s, "pytorch_mean_ms": 2.0, "atlas_mean_ms": 1.0,
                "pytorch_std_ms": 0.1, "atlas_std_ms": 0.1} for s in (10, 100)]
    summary = bench.create_summary_table(records)
    assert summary.loc[0, "geomean_speedup"] == 2.0
    assert summary.loc[0, "largest_size_winner"] == "Hologram"
    for fmt in ("json", "csv"):
        path = bench.save_results(records, tmp_path / f"r.{fmt}", format=fmt)
        assert [r["size"] for r in bench.load_results(path)] == [10, 100]
    a, b = BenchmarkResult("torch", [2.0, 2.1, 1.9]), BenchmarkResult("hg", [1.0, 1.1, 0.9])
    cmp = bench.compare_results(a, b)
    assert cmp["significant"] and cmp["faster"] == "hg"
    assert bench.compare_frameworks(a, b, "op", 10)["speedup"] == 2.0


def test_quick_bench_writes_every_artifact(tmp_path):
    from hologram.cli import main

    out = tmp_path / "bq"
    status = main(["bench", "--quick", "--ops", "add", "sum", "gemm", "mse", "relu(a*b+c)",
                   "--sizes", "1000", "100000", "--gemm-sizes", "32", "--runs", "10",
                   "--no-torch-compile", "--no-progress", "--out", str(out)])
    assert status == 0
    names = set(os.listdir(out))
    assert {"results.json", "results.csv", "report.md", "report.html", "speedup.png",
            "scaling.png", "heatmap.png"} <= names
    assert {f"comparison_{f}.png" for f in ("elementwise", "reductions", "gemm", "losses",
                                            "fused")} <= names
    data = json.loads((out / "results.json").read_text())
    assert len(data["results"]) == 9 and data["system"]["timing_runs"] == 10
    assert all(r["verified"] for r in data["results"])
    # quick runs flag unreliable cases without timing them again
    assert data["system"]["retries"] == 0 and {r["attempts"] for r in data["results"]} == {1}
    assert all(isinstance(r["flag"], str) for r in data["results"])
    report = (out / "report.md").read_text()
    assert "All 9 cases verified" in report and "![speedup.png](speedup.png)" in report
    assert "flagged" in report.split("## Method")[0]  # the headline says either way
    # 1,000-element adds are timed as calls in a loop too
    looped = {(r["operation"], r["size"]) for r in data["results"] if r.get("hologram_loop_us")}
    assert ("add", 1000) in looped
    assert "## Isolated call and call in a loop" in report
    # PyTorch's device is named (the GPU's for the cuda backend where PyTorch has one)
    assert data["system"]["pytorch_device"] == "cpu" and "PyTorch runs on the CPU" in report
    assert {r["pytorch_device"] for r in data["results"]} == {"cpu"}
    assert data["torch_compile"] == {"skipped": "--no-torch-compile"}
    assert "Not run: --no-torch-compile." in report
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_pytorch_runs_on_cuda_against_the_cuda_backend_only_where_it_has_a_gpu(monkeypatch):
    from hologram.bench.runners import torch_device

    cuda_executor = type("Ex", (), {"backend": "cuda"})()
    for has_gpu in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda has_gpu=has_gpu: has_gpu)
        assert torch_device(cuda_executor) == ("cuda" if has_gpu else "cpu")
        assert torch_device(hg.Executor("cpu")) == "cpu" and torch_device(None) == "cpu"


# --- GEMM verification: the forward error bound, not a fixed atol ----------------------------
def _gemm_case(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    return a, b, torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()


def _verify_gemm(actual, a, b, expected):
    from hologram.bench.cases import select
    from hologram.bench.verify import contraction_bound

    (spec,) = select(["gemm"])
    rtol, atol = spec.tolerances(a.shape[0])
    return bench.verify_correctness(actual, expected, rtol=rtol, atol=atol, name="gemm",
                                    raise_on_error=False, bound=contraction_bound(a, b))


def test_gemm_verification_accepts_other_summation_orders():
    a, b, expected = _gemm_case(512)
    # Blocks of k summed in float32 in the reverse order: a correct result, rounded otherwise.
    blocked = np.zeros_like(expected)
    for start in reversed(range(0, 512, 64)):
        blocked += a[:, start:start + 64] @ b[start:start + 64]
    assert not np.array_equal(blocked, expected)
    assert _verify_gemm(blocked, a, b, expected)
    # The AMD report: one element of 262,144 off by 6.5e-5, which the fixed atol (8 eps
    # sqrt(k), rtol 1e-4) rejected, is within the bound.
    amd = expected.copy()
    i = np.unravel_index(np.argmin(np.abs(expected)), expected.shape)
    amd[i] += 6.5e-5
    eps = np.finfo(np.float32).eps
    assert not bench.verify_correctness(amd, expected, rtol=1e-4, atol=8 * eps * np.sqrt(512),
                                        raise_on_error=False)
    check = _verify_gemm(amd, a, b, expected)
    assert check and check.bound > 0 and "elementwise bound" in check.message


def test_gemm_verification_still_fails_wrong_results():
    a, b, expected = _gemm_case(64)
    perturbed = expected.copy()
    perturbed[5, 7] += 1e-2
    check = _verify_gemm(perturbed, a, b, expected)
    assert not check and check.mismatched == 1
    assert not _verify_gemm(expected.T.copy(), a, b, expected)
    assert not _verify_gemm(b @ a, a, b, expected)


def test_contraction_bound():
    from hologram.bench.verify import contraction_bound

    a = np.array([[1.0, -2.0], [0.0, 0.0]], dtype=np.float32)
    b = np.array([[3.0], [4.0]], dtype=np.float32)
    bound = contraction_bound(a, b)
    eps, tiny = np.finfo(np.float32).eps, np.finfo(np.float32).smallest_subnormal
    assert bound.shape == (2, 1)
    assert np.allclose(bound[:, 0], [2 * 2 * (eps * 11 + tiny), 2 * 2 * tiny])
    assert not contraction_bound(a.astype(np.int32), b.astype(np.int32)).any()


def test_suite_gemm_cases_verify_and_flag_a_wrong_product():
    import dataclasses

    from hologram.bench.cases import select
    from hologram.bench.runners import run_spec

    (spec,) = select(["gemm"])
    common = dict(warmup=0, timing=1, executor=hg.Executor(), torch_compile=False, warm_s=0.0)
    good = run_spec(spec, 48, rng=np.random.default_rng(1), **common)
    assert good["verified"], good["error"]
    assert 0 < good["err_bound"] < 1e-2
    swapped = dataclasses.replace(spec, hologram_fn=lambda a, b: spec.hologram_fn(b, a))
    bad = run_spec(swapped, 48, rng=np.random.default_rng(1), **common)
    assert not bad["verified"] and "MISMATCH" in bad["error"]


# --- `hologram bench`: argument checks and an output written all at once ---------------------
def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from hologram.cli import main

    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code
    return status, capsys.readouterr().err


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


BAD_ARGUMENTS = [
    (["--sizes", "-5"], "--sizes"), (["--sizes", "0"], "--sizes"),
    (["--sizes", "1000", "100000000000"], "memory"), (["--gemm-sizes", "1000000"], "memory"),
    (["--threads", "-1"], "--threads"), (["--threads", "0"], "--threads"),
    (["--runs", "0"], "--runs"), (["--warmup", "-1"], "--warmup"),
    (["--backend", "garbage"], "unknown backend 'garbage'"),
    (["--backend", "cuda"], "backend 'cuda'"), (["--ops", "nope"], "unknown ops"),
]


@pytest.mark.parametrize("args, words", BAD_ARGUMENTS, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else "")
def test_bench_rejects_bad_arguments_in_one_line(args, words, tmp_path, capsys):
    if args == ["--backend", "cuda"] and "cuda" in hg.backend.list_available_backends():
        pytest.skip("cuda runs here")
    out = tmp_path / "out"
    status, err = _cli(["bench", "--out", str(out), *args], capsys)
    assert status == 2 and words in _one_line(err)
    assert os.listdir(tmp_path) == []  # nothing created, not even a staging directory


def test_bench_refuses_to_time_the_cuda_emulation(monkeypatch, tmp_path, capsys):
    from hologram.backends.cuda import triton_process

    if not triton_process.triton_installed():
        pytest.skip("triton is not installed: no cuda emulation to refuse")
    monkeypatch.setenv("HOLOGRAM_CUDA_EMULATE", "1")
    status, err = _cli(["bench", "--out", str(tmp_path / "out"), "--backend", "cuda"], capsys)
    assert status == 2 and "say nothing about a GPU" in _one_line(err)
    assert os.listdir(tmp_path) == []


def test_bench_rejects_a_malformed_environment_variable(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HOLOGRAM_BENCH_QUICK", "perhaps")
    status, err = _cli(["bench", "--out", str(tmp_path / "out")], capsys)
    assert status == 2 and "HOLOGRAM_BENCH_QUICK='perhaps'" in _one_line(err)


def test_bench_errors_are_one_line_from_the_command_line(tmp_path):
    import subprocess
    import sys

    for args, env in [(["--sizes", "-5"], {}), ([], {"HOLOGRAM_BENCH_QUICK": "perhaps"})]:
        run = subprocess.run([sys.executable, "-m", "hologram", "bench", "--out",
                              str(tmp_path / "out"), *args], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=120)
        assert run.returncode == 2 and run.stdout == ""
        assert _one_line(run.stderr).startswith("hologram bench: ")


def test_bench_rejects_an_out_it_cannot_write(tmp_path, monkeypatch, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    (foreign / "report.md").write_text("old")
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: let the check see what a user would
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: os.fspath(path) not in (
            str(read_only), str(read_only / "sub")) and real_access(path, mode, **kw))
    monkeypatch.chdir(tmp_path)
    cases = [(a_file, "not a directory"), (a_file / "out", "is not a directory"),
             (read_only / "out", "not writable"), (foreign, "notes.txt"),
             (tmp_path, "current directory"), (".", "current directory")]
    try:
        for out, words in cases:
            status, err = _cli(["bench", "--ops", "add", "--out", str(out)], capsys)
            assert status == 2 and words in _one_line(err), (out, err)
    finally:
        read_only.chmod(0o755)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["file", "mine", "ro"]
    assert os.listdir(read_only) == []


def _fake_records(cases, **_):
    """What run_suite returns, without running anything: the output tests need no timings."""
    records = []
    for spec, size in cases:
        record = {"family": spec.family, "operation": spec.name, "size": size,
                  "shape": str(size), "dtype": "float32", "backend": "cpu", "rtol": 1e-5,
                  "atol": 1e-8, "verified": True, "max_abs_err": 0.0, "max_rel_err": 0.0,
                  "error": ""}
        record.update(BenchmarkResult("pytorch", [2.0, 2.2]).summary("pytorch_"))
        record.update(BenchmarkResult("hologram", [1.0, 1.1]).summary("hologram_"))
        record["speedup"] = record["pytorch_median_ms"] / record["hologram_median_ms"]
        records.append(record)
    return records


def _fake_section(config):
    """What the torch.compile section returns, without compiling anything."""
    row = {"model": "mlp", "mode": "training", "threads": 1, "check": "ok",
           "ms": {"eager": 3.0, "hologram": 2.0, "inductor": 4.0}}
    first = {"model": "mlp", "mode": "training", "hologram_cold_s": 1.5,
             "hologram_backend_cold_s": 0.5, "programs": 2, "hologram_warm_process_s": 0.7,
             "hologram_backend_warm_s": 0.02, "warm_disk_hits": 2, "inductor_s": None}
    return {"threads": [1], "inductor": "available", "rows": [row], "first_calls": [first],
            "warm_process": "ok", "quick": False, "seconds": 1.0}


@pytest.fixture
def fake_suite(monkeypatch, default_threads):
    monkeypatch.setattr("hologram.bench.runners.run_suite", _fake_records)
    monkeypatch.setattr("hologram.bench.suite.compile_section", _fake_section)
    threads = torch.get_num_threads()
    yield ["bench", "--ops", "add", "--sizes", "10", "100", "--no-progress"]
    torch.set_num_threads(threads)


def _old_output(tmp_path) -> tuple[str, dict[str, bytes]]:
    out = tmp_path / "out"
    out.mkdir()
    old = {"results.json": b'{"results": []}', "report.md": b"# old report",
           "report.html": b"<p>old</p>", "comparison_gemm.png": b"old plot"}
    for name, data in old.items():
        (out / name).write_bytes(data)
    return str(out), old


def _contents(out: str) -> dict[str, bytes]:
    return {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}


def test_the_report_names_a_gpu_backends_adapter(fake_suite, tmp_path):
    """On webgpu the System table says which adapter ran (lavapipe here, whose numbers say
    nothing about a GPU) and whether it flushes subnormals."""
    from hologram.cli import main

    if "webgpu" not in hg.backend.list_available_backends():
        pytest.skip("no Vulkan driver (apt-get install mesa-vulkan-drivers libvulkan1)")
    out = tmp_path / "wg"
    assert main([*fake_suite, "--backend", "webgpu", "--out", str(out)]) == 0
    system = json.loads((out / "results.json").read_text())["system"]
    with hg.Executor("webgpu") as ex:
        stats = ex.memory_stats()
    assert system["hologram_backend"] == "webgpu" and system["adapter"] == stats["adapter"]
    assert system["flushes_subnormals"] == stats["flushes_subnormals"]
    assert stats["adapter"] in (out / "report.md").read_text()


def test_bench_replaces_the_previous_output_as_a_whole(fake_suite, tmp_path, capsys):
    out, _ = _old_output(tmp_path)
    status, _ = _cli([*fake_suite, "--out", out], capsys)
    assert status == 0
    names = set(os.listdir(out))
    assert "comparison_gemm.png" not in names  # no stale plot beside the new report
    assert {"results.json", "results.csv", "report.md", "report.html", "speedup.png"} <= names
    with open(os.path.join(out, "results.json")) as f:
        data = json.load(f)
    assert len(data["results"]) == 2
    assert data["torch_compile"]["rows"][0]["ms"]["hologram"] == 2.0
    report = _contents(out)["report.md"].decode()
    # the section's table, ratios computed from the medians (eager 3.0, inductor 4.0 ms
    # over hologram's 2.0 ms)
    assert "## torch.compile: whole models" in report
    assert "| mlp | training | 1 | 3.000 | 2.000 | 4.000 | 1.50 | 2.00 | ok |" in report
    assert "| mlp | training | 1.5 | 0.5 | 2 | 0.7 | 0.02 | 2 | — |" in report
    assert b"<td>1.50</td>" in _contents(out)["report.html"]
    assert os.listdir(tmp_path) == ["out"]  # no staging or old directory left
    status, _ = _cli([*fake_suite, "--out", str(tmp_path / "a" / "b")], capsys)
    assert status == 0 and os.listdir(tmp_path / "a" / "b")


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "new"])
def test_interrupt_while_writing_leaves_the_old_output(existing, fake_suite, tmp_path,
                                                       monkeypatch, capsys):
    from hologram.bench import report

    out, old = _old_output(tmp_path) if existing else (str(tmp_path / "new" / "out"), {})
    real_write_report = report.write_report

    def interrupted(records, system, plots, out_dir, **kw):
        real_write_report(records, system, plots, out_dir, **kw)  # written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", interrupted)
    status, err = _cli([*fake_suite, "--out", out], capsys)
    assert status == 130 and "interrupted" in _one_line(err)
    if existing:
        assert _contents(out) == old
        assert os.listdir(tmp_path) == ["out"]
    else:
        assert os.listdir(tmp_path) == []  # the parents it made are gone too


def test_interrupt_while_benchmarking_leaves_no_staging_directory(fake_suite, tmp_path,
                                                                  monkeypatch, capsys):
    out, old = _old_output(tmp_path)

    def interrupted(cases, **_):
        assert any(name.endswith(".tmp") for name in os.listdir(tmp_path))  # made up front
        raise KeyboardInterrupt

    monkeypatch.setattr("hologram.bench.runners.run_suite", interrupted)
    status, _ = _cli([*fake_suite, "--out", out], capsys)
    assert status == 130 and _contents(out) == old and os.listdir(tmp_path) == ["out"]


def test_sigterm_while_benchmarking_leaves_the_old_output(fake_suite, tmp_path, monkeypatch,
                                                          capsys):
    import signal

    out, old = _old_output(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)

    def terminated(cases, **_):
        os.kill(os.getpid(), signal.SIGTERM)  # handled: raises SystemExit(143) here

    monkeypatch.setattr("hologram.bench.runners.run_suite", terminated)
    status, _ = _cli([*fake_suite, "--out", out], capsys)
    assert status == 143 and _contents(out) == old and os.listdir(tmp_path) == ["out"]
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_full_disk_leaves_the_old_results(fake_suite, tmp_path, monkeypatch, capsys):
    import errno

    from hologram.bench import results

    out, old = _old_output(tmp_path)

    def disk_full(records, path, format="json", metadata=None, sections=None):
        open(path, "w").close()  # what a full disk left: a 0-byte file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(results, "save_results", disk_full)
    status, err = _cli([*fake_suite, "--out", out], capsys)
    line = _one_line(err)
    assert status == 2 and "No space left on device" in line and "results.json" in line
    assert "unchanged" in line
    assert _contents(out) == old and os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("failure", [OSError(18, "Invalid cross-device link"),
                                     KeyboardInterrupt()], ids=["oserror", "interrupt"])
def test_a_failed_move_into_place_restores_the_old_output(failure, tmp_path, monkeypatch):
    from hologram.bench import output

    out, old = _old_output(tmp_path)
    real_rename = os.rename

    def rename(src, dst):
        if src.endswith(".tmp"):  # the new directory's move into place
            raise failure
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    expected = output.OutputError if isinstance(failure, OSError) else KeyboardInterrupt
    target = output.check_output(out)
    with pytest.raises(expected), output.staged_output(target) as staging:
        (tmp_path / os.path.basename(staging) / "results.json").write_text("new")
    assert _contents(out) == old and os.listdir(tmp_path) == ["out"]


# --- the torch.compile section -----------------------------------------------------------
def test_compile_section_quick_times_checked_models():
    from hologram.bench import compile as compile_bench

    section = compile_bench.run(quick=True)
    assert [(r["model"], r["mode"], r["threads"]) for r in section["rows"]] == [
        ("mlp", "inference", 1), ("mlp", "training", 1)]
    for row in section["rows"]:
        assert row["check"] == "ok"  # the compiled model agreed with eager before timing
        assert set(row["ms"]) == {"eager", "hologram"} and min(row["ms"].values()) > 0
    first = {f["mode"]: f for f in section["first_calls"]}
    # an empty program cache: every program is compiled, none comes from the disk
    assert first["inference"]["programs"] == 1 and first["training"]["programs"] == 2
    assert all(f["hologram_cold_s"] >= f["hologram_backend_cold_s"] > 0
               for f in first.values())
    assert section["inductor"] == "not run (quick mode)"
    md = "\n".join(compile_bench.markdown(section))
    assert md.count("| mlp | ") == 4 and "Quick mode" in md


def test_compile_section_reports_inductor_unavailable(monkeypatch):
    from hologram.bench import compile as compile_bench

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore")

    monkeypatch.setattr(torch, "compile", no_compiler)
    status = compile_bench.inductor_status(torch)
    assert status == ("unavailable: RuntimeError: InvalidCxxCompiler: No working C++ "
                      "compiler found")


def test_compile_section_without_torch(monkeypatch):
    from hologram.bench import compile as compile_bench
    from hologram.bench.dev import cpu

    monkeypatch.setattr(cpu, "import_torch", lambda: None)
    section = compile_bench.run(quick=True)
    assert section == {"skipped": "PyTorch is not installed"}
    assert compile_bench.markdown(section)[2] == "- Not run: PyTorch is not installed."


def test_compile_section_flags_a_cache_the_second_process_could_not_use(monkeypatch):
    from hologram.bench import compile as compile_bench
    from hologram.bench.dev import training

    plan = compile_bench.Plan(("mlp",), (1,), False, True, training.TINY_SIZES, True)
    monkeypatch.setattr(compile_bench, "_timed_rows", lambda *args: [])
    warm = {"mlp/inference": {"first_call_s": 1.0, "backend_s": 0.5, "disk_hits": 0}}
    for version, expected in ((compile_bench.compiler_version(), "ok"),
                              ("0.0+edited", "the compiler's sources changed")):
        monkeypatch.setattr(compile_bench, "_warm_process",
                            lambda plan, cache, v=version: {**warm, "compiler_version": v})
        assert compile_bench.run(plan=plan)["warm_process"].startswith(expected)


def test_the_gpu_benchmark_runs_its_rows_checked_where_there_is_no_gpu():
    """hologram.bench.dev.cuda (docs/cuda.md's H100 table) on the cpu backend at small
    sizes: every row computes, checks against PyTorch and times; on a GPU the same rows
    run on the cuda backend against PyTorch CUDA."""
    from hologram.bench.dev import cuda as cuda_bench

    result = cuda_bench.run(backend="cpu")
    assert result["torch_device"] == "cpu" and len(result["rows"]) == 14
    assert all(row["check"] == "ok" for row in result["rows"]), result["rows"]
    assert all(row["ratio"] > 0 for row in result["rows"] if row["case"] != "dlpack")
    assert "| matmul |" in cuda_bench.table(result)
