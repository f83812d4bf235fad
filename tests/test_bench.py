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
    f"{info['cpu_freq_mhz']:.0f} {info['memory_total_gb']:.1f}"  # the seeds' formats


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
    report = (out / "report.md").read_text()
    assert "All 9 cases verified" in report and "![speedup.png](speedup.png)" in report
    assert "data:image/png;base64," in (out / "report.html").read_text()
