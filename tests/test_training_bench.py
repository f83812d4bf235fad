"""hologram.bench.dev.training on tiny models: well-formed rows whose checks pass, and the report
section hologram.bench.dev.run builds from them."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hologram.bench.dev import run as bench_run
from hologram.bench.dev import training


def test_training_bench_rows_are_well_formed():
    result = training.run(quick=True, sizes=training.TINY_SIZES)
    rows = result["rows"]
    device = training._device()  # "hologram device", "(lazy)" with recorded execution
    assert [r["hologram"] for r in rows] == [
        device, "hologram_torch.nn on CPU tensors", *[device] * 8]
    assert [r["case"].endswith(", inference") for r in rows] == [False] * 6 + [True] * 4
    assert rows[5]["case"].endswith("bf16 autocast")
    assert rows[5]["baseline"] == "hologram device, float32"
    for r in rows:
        assert r["check"] == "ok", r
        assert r["hologram_ms"] > 0 and r["cpu_ms"] > 0
        # the ratio comes from the unrounded medians; the row's ms are rounded to 1 µs
        low = (r["cpu_ms"] - 5e-4) / (r["hologram_ms"] + 5e-4)
        high = (r["cpu_ms"] + 5e-4) / (r["hologram_ms"] - 5e-4)
        assert low * 0.995 <= r["ratio"] <= high * 1.005, r
        assert len(r["best_ms"]) == 2 and min(r["best_ms"]) > 0
        # (an inference step may be all front kernels, which runner.run does not count)
        assert r["kernel_calls"] > 0 or r["case"].endswith(", inference")
        assert all(isinstance(op, str) and n > 0 for op, n in r["fallbacks"].items())
        assert "kernel calls" in r["note"]
        if r["hologram"] == device and "inference" not in r["case"]:  # both sides' peaks
            assert len(r["peak_mb"]) == 2 and all(mb > 0 for mb in r["peak_mb"]), r
    assert len(result["load_average"]) == 2
    table = training.table(result)
    steps, _, first = table.partition("\n\n")
    assert steps.count("\n") == len(rows) + 1 and "| ok |" in steps
    # the first step in fresh processes: compiled cold, loaded warm, the same loss
    first_rows = result["first_step"]
    assert [r["case"] for r in first_rows] == list(training.FIRST_STEP_CASES)
    for r in first_rows:
        assert r["same_loss"] and r["cold"]["compiled"] > 0 and r["warm"]["loaded"] > 0, r
    assert first.count("\n| ") >= len(first_rows)
    device_result = {"threads": 1, "rows": []}
    report = "\n".join(bench_run._torch_sections(device_result, result))
    assert "## Training steps" in report and table in report
