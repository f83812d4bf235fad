"""tools/pytorch_suites.py's own logic: test names and sampling, outcomes from pytest's
reports, the table, and the expected-failure list. No PyTorch checkout is needed."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "pytorch_suites.py"
_spec = importlib.util.spec_from_file_location("pytorch_suites", TOOL)
ps = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("pytorch_suites", ps)  # dataclasses look their module up
_spec.loader.exec_module(ps)

DEV = "test_x.py::TestFooPRIVATEUSE1::test_compare_cpu_abs_hologram_float32"
CPU = "test_x.py::TestFooCPU::test_compare_cpu_abs_cpu_float32"


def test_neutral_id_is_the_same_for_both_devices():
    neutral = "test_x.py::TestFoo::test_compare_cpu_abs_float32"
    assert ps.neutral_id(DEV) == ps.neutral_id(CPU) == neutral
    assert ps.neutral_id("t.py::TestBarHOLOGRAM::test_y_hologram") == "t.py::TestBar::test_y"
    assert ps.neutral_id("t.py::TestBarCPU::test_cpu_thing_cpu") == "t.py::TestBar::test_cpu_thing"


def test_sampling_picks_the_same_tests_on_both_devices():
    names = [f"t.py::TestFooPRIVATEUSE1::test_{i}_hologram_float32" for i in range(2000)]
    kept = [n for n in names if ps.sampled(n, 0.3)]
    assert 500 < len(kept) < 700
    for name in names:
        cpu = name.replace("PRIVATEUSE1", "CPU").replace("_hologram", "_cpu")
        assert ps.sampled(name, 0.3) == ps.sampled(cpu, 0.3)
    assert all(ps.sampled(n, 1.0) for n in names)


def test_selection_by_class_prefix_and_always():
    suite = ps.Suite("s", "test_x.py", ("TestFoo",), "test_compare")
    assert ps.selected(DEV, suite, 1.0, ())
    assert not ps.selected("test_x.py::TestOtherCPU::test_compare_cpu", suite, 1.0, ())
    assert not ps.selected("test_x.py::TestFooCPU::test_other_cpu", suite, 1.0, ())
    assert not ps.selected(DEV, suite, 0.0, ())
    assert ps.selected(DEV, suite, 0.0, ("abs",))


def _report(when, outcome, longrepr=None, **extra):
    return SimpleNamespace(when=when, failed=outcome == "failed", skipped=outcome == "skipped",
                           longrepr=longrepr, duration=0.5, **extra)


def test_outcome_of_reports():
    crash = SimpleNamespace(reprcrash=SimpleNamespace(
        message="AssertionError: not close\n  To execute this test, run the following ..."))
    passed = _report("setup", "passed")
    assert ps.outcome_of([passed, _report("call", "passed"), _report("teardown", "passed")]) \
        == ("passed", "")
    assert ps.outcome_of([passed, _report("call", "failed", crash)]) \
        == ("failed", "AssertionError: not close")
    assert ps.outcome_of([_report("setup", "failed", "boom")]) == ("error", "boom")
    skip = _report("call", "skipped", ("f.py", 3, "Skipped: Only runs on cuda"))
    assert ps.outcome_of([passed, skip]) == ("skipped", "Skipped: Only runs on cuda")
    xfail = _report("call", "skipped", ("f.py", 3, ""), wasxfail="known")
    assert ps.outcome_of([passed, xfail]) == ("xfailed", "known")
    unexpected = _report("call", "failed", "Unexpected success")
    assert ps.outcome_of([passed, unexpected]) == ("failed", "Unexpected success")


def test_read_records_finds_the_test_that_was_running(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = [{"start": "a"}, {"id": "a", "outcome": "passed", "message": ""}, {"start": "b"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"id": "c", "ou')
    outcomes, unfinished = ps.read_records(path)
    assert list(outcomes) == ["a"] and unfinished == ["b"]
    assert ps.read_records(tmp_path / "missing") == ({}, [])


def _results(baseline=True):
    def rec(outcome, message=""):
        return {"outcome": outcome, "message": message, "seconds": 0.1}

    dev = {f"t.py::TestFooPRIVATEUSE1::test_{n}_hologram": rec(o, m) for n, o, m in [
        ("ok", "passed", ""), ("strides", "failed", "stride mismatch"),
        ("both", "failed", "old file"), ("skip", "skipped", "cuda"),
        ("xf", "xfailed", ""), ("crash", "crashed", "exit status -11"),
        ("fixed", "passed", "")]}
    cpu = {k.replace("PRIVATEUSE1", "CPU").replace("_hologram", "_cpu"): rec("passed")
           for k in dev}
    cpu["t.py::TestFooCPU::test_both_cpu"] = rec("failed", "old file")
    suite = ps.Suite("s", "t.py")
    tests = ps.merge(suite, dev, cpu if baseline else None)
    return {"suites": {"s": {"file": "t.py", "fraction": 0.5, "always": [], "keyword": None,
                             "baseline": baseline, "tests": tests}}}


def test_counts_and_table():
    results = _results()
    row = ps.counts(results["suites"]["s"]["tests"], True)
    assert row == {"run": 7, "passed": 2, "failed": 3, "skipped": 1, "xfailed": 1,
                   "only_device": 2, "both": 1, "passed_cpu": 6, "failed_cpu": 1}
    table = ps.format_table(results).splitlines()
    assert table[2] == "| t.py (s), 50% | 7 | 2 (6) | 3 (1) | 1 | 1 | 2 | 1 |"
    assert ps.format_table(_results(baseline=False)).splitlines()[2] \
        == "| t.py (s), 50% | 7 | 2 | 3 | 1 | 1 | 3 | n/a |"


def test_expected_list_new_failures_and_stale_entries(tmp_path):
    listed = tmp_path / "expected.txt"
    listed.write_text(
        "# reasons\n"
        "t.py::TestFooPRIVATEUSE1::test_strides_hologram  strides: not propagated\n"
        "t.py::TestFooPRIVATEUSE1::test_fixed_hologram  values: fixed since\n"
        "t.py::TestFooPRIVATEUSE1::test_both_hologram  harness: fails on the CPU too\n"
        "t.py::TestFooPRIVATEUSE1::test_not_sampled_hologram  sparse: not run here\n")
    expected = ps.load_expected(listed)
    assert expected["t.py::TestFooPRIVATEUSE1::test_strides_hologram"] == "strides: not propagated"
    comparison = ps.compare(_results(), expected)
    assert comparison.new == [("t.py::TestFooPRIVATEUSE1::test_crash_hologram", "exit status -11")]
    assert sorted(t for t, _ in comparison.stale) == [
        "t.py::TestFooPRIVATEUSE1::test_both_hologram",
        "t.py::TestFooPRIVATEUSE1::test_fixed_hologram"]
    out = io.StringIO()
    ps.report(_results(), expected, out)
    assert "test_crash_hologram  crash: the test process died" in out.getvalue()

    assert ps.prune_expected(listed, {t for t, _ in comparison.stale}) == 2
    assert set(ps.load_expected(listed)) == {
        "t.py::TestFooPRIVATEUSE1::test_strides_hologram",
        "t.py::TestFooPRIVATEUSE1::test_not_sampled_hologram"}
    assert listed.read_text().startswith("# reasons\n")


@pytest.mark.parametrize("text", ["t.py::A::test_a\n", "t.py::A::test_a x\nt.py::A::test_a y\n"])
def test_expected_list_rejects_entries_without_reason_or_twice(tmp_path, text):
    listed = tmp_path / "expected.txt"
    listed.write_text(text)
    with pytest.raises(ValueError, match=r"no reason|twice"):
        ps.load_expected(listed)


def test_report_only_exit_status(tmp_path, capsys):
    out = tmp_path / "results.json"
    out.write_text(json.dumps(_results()))
    listed = tmp_path / "expected.txt"
    listed.write_text("t.py::TestFooPRIVATEUSE1::test_strides_hologram  strides\n"
                      "t.py::TestFooPRIVATEUSE1::test_crash_hologram  crash\n")
    assert ps.main(["--report-only", "--out", str(out), "--expected", str(listed)]) == 0
    assert "| t.py (s), 50% |" in capsys.readouterr().out
    listed.write_text("t.py::TestFooPRIVATEUSE1::test_strides_hologram  strides\n")
    assert ps.main(["--report-only", "--out", str(out), "--expected", str(listed)]) == 1


def test_the_projects_expected_list_parses():
    expected = ps.load_expected(ps.DEFAULT_EXPECTED)
    assert all(test_id.count("::") == 2 for test_id in expected)
