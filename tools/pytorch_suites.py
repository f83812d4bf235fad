"""Run PyTorch's own device-generic test suites on ``torch.device('hologram')``.

PyTorch's test files (``test_torch.py``, ``test_nn.py``, ...) instantiate their device-generic
classes for every device type they find; with ``PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1``
they instantiate them for the ``hologram`` device only. This tool runs a chosen selection of
them twice, on the device and then on the CPU over the same sampled tests, one pytest process
at a time, and sorts each failure: a test that fails on the CPU too is the harness's (PyTorch's
test files are older or newer than the installed torch), one that fails only on ``hologram``
is the device's. The device failures we know of are listed, with a reason each, in
``tools/pytorch_suites_expected.txt``; the tool reports failures missing from that list and
entries that no longer fail. The list may only shrink.

    python tools/pytorch_suites.py --pytorch-src ~/pytorch --suite torch:0.5 --suite indexing

The same module is the pytest plugin that the runs load (``-p pytorch_suites``, with
``--noconftest``: the checkout's own conftest is not used). It adds the names that old test
files import and the installed torch no longer has, samples the tests, keeps
``test_compare_cpu`` (``@onlyCUDA``) running for the device, and writes one JSON line per
test as it finishes, so a run that crashes resumes after the test that crashed it.
PyTorch's files are read from the checkout given, never copied into this project.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXPECTED = ROOT / "tools" / "pytorch_suites_expected.txt"
DEFAULT_OUT = ROOT / "build" / "pytorch-suites" / "results.json"
DEVICE = "hologram"
BASELINE = "cpu"
# The child pytest's settings travel as JSON in this variable (a channel between this
# tool and its plugin, not a setting of the project).
PLUGIN_ENV = "PYTORCH_SUITES_PLUGIN"
FAILED = frozenset({"failed", "error", "crashed"})


# -- the suites ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Suite:
    """A selection of one test file: its device-generic classes (device-neutral names; empty
    for all), a method-name prefix, whether the CPU baseline means anything, and the extra
    environment it needs."""

    name: str
    file: str
    classes: tuple[str, ...] = ()
    prefix: str = ""
    baseline: bool = True
    bypass_device_restrictions: bool = False
    env: dict[str, str] = field(default_factory=dict)


SUITES = {
    s.name: s
    for s in (
        # @onlyCUDA @slowTest; run on the device with torch's bypass, compared with the CPU by
        # the test itself, so a CPU run would compare the CPU with itself.
        Suite("compare_cpu", "test_ops.py", ("TestCommon",), "test_compare_cpu",
              baseline=False, bypass_device_restrictions=True,
              env={"PYTORCH_TEST_WITH_SLOW": "1"}),
        Suite("modules", "test_modules.py", ("TestModule",)),
        Suite("nn", "test_nn.py", ("TestNNDeviceType",)),
        Suite("torch", "test_torch.py", ("TestTorchDeviceType",)),
        Suite("view_ops", "test_view_ops.py"),
        Suite("indexing", "test_indexing.py"),
        Suite("unary_ufuncs", "test_unary_ufuncs.py"),
        Suite("binary_ufuncs", "test_binary_ufuncs.py"),
        Suite("reductions", "test_reductions.py"),
    )
}


# -- test names ----------------------------------------------------------------------------

# common_device_type names an instantiated class <Base><DEVICE> and a test
# <name>_<device>[_<dtype>...]; the last such token is the device (names may contain "cpu").
_CLASS_SUFFIX = re.compile(r"(PRIVATEUSE1|HOLOGRAM|CPU)$")
_DEVICE_TOKEN = re.compile(rf"_(?:{DEVICE}|privateuse1|{BASELINE})(?=_|$|\[)")


def neutral_id(nodeid: str) -> str:
    """``test_x.py::TestFooPRIVATEUSE1::test_bar_hologram_float32`` ->
    ``test_x.py::TestFoo::test_bar_float32``: the same for every device."""
    parts = nodeid.split("::")
    if len(parts) >= 3:
        parts[-2] = _CLASS_SUFFIX.sub("", parts[-2])
    matches = list(_DEVICE_TOKEN.finditer(parts[-1]))
    if matches:
        last = matches[-1]
        parts[-1] = parts[-1][: last.start()] + parts[-1][last.end():]
    return "::".join(parts)


def sampled(nodeid: str, fraction: float) -> bool:
    """Whether a test is in the ``fraction`` sample: the sha1 of its device-neutral name,
    read as a number in [0, 1), is below it; every device picks the same tests."""
    if fraction >= 1.0:
        return True
    digest = hashlib.sha1(neutral_id(nodeid).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


def selected(nodeid: str, suite: Suite, fraction: float, always: tuple[str, ...]) -> bool:
    """Whether a collected test belongs to the suite's classes and prefix and is sampled
    (or its name contains one of ``always``)."""
    parts = neutral_id(nodeid).split("::")
    cls, name = (parts[-2], parts[-1]) if len(parts) >= 3 else ("", parts[-1])
    if suite.classes and cls not in suite.classes:
        return False
    if not name.startswith(suite.prefix):
        return False
    return any(a in name for a in always) or sampled(nodeid, fraction)


# -- the pytest plugin (loaded in the child processes with -p pytorch_suites) --------------


def _shim_old_test_files() -> None:
    """Names that PyTorch's older test files import and the installed torch moved or dropped.
    Each is the installed torch's equivalent, or empty where the feature left."""
    from torch.testing._internal import (
        common_cuda,
        common_device_type,
        common_methods_invocations,
        common_nn,
        common_utils,
    )

    def skip_ops(*args):
        # The old form is skipOps(test_case_name, base_test_name, to_skip); the installed
        # skipOps(to_skip) reads both names from the function it decorates.
        return common_device_type.skipOps(args[-1])

    shims = [
        (common_methods_invocations, "xfail", common_device_type.xfail),
        (common_methods_invocations, "skip", common_device_type.skip),
        (common_methods_invocations, "skipOps", skip_ops),
        # binary_ufuncs is built from op_db + python_ref_db today.
        (common_methods_invocations, "binary_ufuncs_and_refs",
         common_methods_invocations.binary_ufuncs),
        (common_cuda, "tf32_is_not_fp32", lambda: False),
        (common_nn, "new_module_tests", []),
        (common_utils, "skipIfMps", common_utils.skipIfMPS),
    ]
    for module, name, value in shims:
        if not hasattr(module, name):
            setattr(module, name, value)


class _Recorder:
    """The child's side: picks the sampled tests and writes one JSON line per test."""

    def __init__(self, settings: dict):
        self.suite = SUITES[settings["suite"]]
        self.fraction = settings["fraction"]
        self.always = tuple(settings["always"])
        self.records = Path(settings["records"])
        self.reports: list = []

    def _write(self, record: dict) -> None:
        with open(self.records, "a") as f:
            f.write(json.dumps(record) + "\n")

    def pytest_collection_modifyitems(self, config, items) -> None:
        done, _ = read_records(self.records)  # a resumed run skips what already ran
        keep, drop = [], []
        for item in items:
            ok = item.nodeid not in done and selected(
                item.nodeid, self.suite, self.fraction, self.always)
            (keep if ok else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        # Written before the test runs: a test that kills the process leaves a start
        # without an outcome.
        self._write({"start": nodeid})
        self.reports = []

    def pytest_runtest_logreport(self, report) -> None:
        self.reports.append(report)

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        outcome, message = outcome_of(self.reports)
        seconds = sum(r.duration for r in self.reports)
        self._write({"id": nodeid, "outcome": outcome, "message": message,
                     "seconds": round(seconds, 3)})


def pytest_configure(config) -> None:
    """In a run started by this tool: register the device, add the old files' names, and
    record outcomes. Elsewhere the plugin does nothing."""
    settings = os.environ.get(PLUGIN_ENV)
    if not settings:
        return
    settings = json.loads(settings)
    import hologram_torch  # noqa: F401  (the device exists before common_device_type looks)

    _shim_old_test_files()
    if settings["bypass_device_restrictions"]:
        from torch.testing._internal.common_device_type import PrivateUse1TestBase

        PrivateUse1TestBase.bypass_device_restrictions = True
    config.pluginmanager.register(_Recorder(settings), "pytorch_suites_recorder")


# -- outcomes ------------------------------------------------------------------------------

MESSAGE_CHARS = 300


def _message(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        text = longrepr[2]
    elif getattr(longrepr, "reprcrash", None) is not None:
        text = longrepr.reprcrash.message
    else:
        text = str(longrepr or "")
    # common_utils appends how to rerun the test; the node id says that already.
    text = text.split("To execute this test, run the following")[0]
    return " ".join(text.split())[:MESSAGE_CHARS]


def outcome_of(reports) -> tuple[str, str]:
    """One outcome and message for a test from its setup, call and teardown reports:
    a failure of the call is ``failed``, of setup or teardown ``error``; an expected failure
    is ``xfailed``; an unexpected success (unittest's) is a failure, as pytest reports it."""
    for report in reports:
        if report.failed:
            return ("failed" if report.when == "call" else "error"), _message(report)
    for report in reports:
        if report.skipped:
            if hasattr(report, "wasxfail"):
                return "xfailed", " ".join(str(report.wasxfail).split())[:MESSAGE_CHARS]
            return "skipped", _message(report)
    return "passed", ""


def read_records(path: Path) -> tuple[dict[str, dict], list[str]]:
    """The outcomes written so far (the last one per test), and the tests that started and
    have none: the one that was running when the process died."""
    outcomes: dict[str, dict] = {}
    started: dict[str, None] = {}
    if not path.exists():
        return outcomes, []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if "start" in record:
            started[record["start"]] = None
        else:
            outcomes[record["id"]] = record
            started.pop(record["id"], None)
    return outcomes, [t for t in started if t not in outcomes]


# -- running -------------------------------------------------------------------------------


class SuiteError(RuntimeError):
    """pytest ended outside any test (a file that does not import, a bad -k)."""


@dataclass
class RunOptions:
    pytorch_src: Path
    workdir: Path
    fraction: float = 1.0
    always: tuple[str, ...] = ()
    keyword: str | None = None
    timeout: int = 120
    stall: int = 900
    wall_cap: float = 0.0
    max_restarts: int = 20


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_suite(suite: Suite, device: str, opts: RunOptions) -> tuple[dict[str, dict], dict]:
    """Run one suite on one device (``hologram`` or ``cpu``) in pytest processes, one at a
    time, restarting after a test that crashed or hung the process. Returns the outcome of
    each test by node id, and facts about the run (seconds, restarts, cut by the wall cap)."""
    test_dir = opts.pytorch_src / "test"
    records = opts.workdir / f"{suite.name}-{device}.jsonl"
    log = opts.workdir / f"{suite.name}-{device}.log"
    records.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    ini = opts.workdir / "pytest.ini"  # the checkout's own pytest.ini is not ours
    ini.write_text("[pytest]\n")
    settings = {"suite": suite.name, "fraction": opts.fraction, "always": list(opts.always),
                "records": str(records),
                "bypass_device_restrictions": suite.bypass_device_restrictions}
    env = dict(os.environ, **suite.env)
    env[PLUGIN_ENV] = json.dumps(settings)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "privateuse1" if device == DEVICE else device
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).parent), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", suite.file, "-p", "pytorch_suites", "--noconftest",
           "-c", str(ini), "--rootdir", str(test_dir), "-q", "-p", "no:cacheprovider",
           "--timeout", str(opts.timeout)]
    if opts.keyword:
        cmd += ["-k", opts.keyword]

    started = time.monotonic()
    restarts, cut = 0, False
    while True:
        with open(log, "a") as out:
            proc = subprocess.Popen(cmd, cwd=test_dir, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            why = _wait(proc, records, opts, started)
        rc = proc.returncode
        if why == "wall cap":  # the test that was running is left out, as the rest
            cut = True
            break
        _, unfinished = read_records(records)
        for nodeid in unfinished:
            reason = why or f"the test process ended with exit status {rc}"
            with open(records, "a") as f:
                f.write(json.dumps({"id": nodeid, "outcome": "crashed", "message": reason,
                                    "seconds": None}) + "\n")
        if not unfinished:
            if rc in (0, 1, 5) and not why:  # all passed / some failed / none selected
                break
            raise SuiteError(f"{suite.file} on {device}: pytest exited with status {rc} "
                             f"outside any test ({why or 'no test was running'}); "
                             f"the end of {log}:\n{_tail(log)}")
        restarts += 1
        if restarts > opts.max_restarts:
            cut = True
            break
    outcomes, _ = read_records(records)
    facts = {"seconds": round(time.monotonic() - started), "restarts": restarts, "cut": cut}
    return outcomes, facts


def _wait(proc: subprocess.Popen, records: Path, opts: RunOptions, started: float) -> str:
    """Wait for the process; kill its process group when no test has finished for
    ``opts.stall`` seconds or the suite's wall cap has passed. Returns why it was killed."""
    last = time.monotonic()
    seen = records.stat().st_mtime if records.exists() else 0.0
    while proc.poll() is None:
        time.sleep(2)
        mtime = records.stat().st_mtime if records.exists() else 0.0
        if mtime != seen:
            seen, last = mtime, time.monotonic()
        why = ""
        if opts.wall_cap and time.monotonic() - started > opts.wall_cap:
            why = "wall cap"
        elif time.monotonic() - last > opts.stall:
            why = f"no test finished for {opts.stall} s; the process was killed"
        if why:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return why
    return ""


def merge(suite: Suite, device_outcomes: dict[str, dict],
          cpu_outcomes: dict[str, dict] | None) -> dict[str, dict]:
    """Pair each device test with the same test on the CPU (by device-neutral name)."""
    cpu = {neutral_id(k): v for k, v in (cpu_outcomes or {}).items()}
    tests = {}
    for nodeid, record in sorted(device_outcomes.items()):
        key = neutral_id(nodeid)
        entry = {"id": nodeid, DEVICE: _brief(record)}
        if key in cpu:
            entry[BASELINE] = _brief(cpu[key])
        tests[key] = entry
    return tests


def _brief(record: dict) -> dict:
    return {"outcome": record["outcome"], "message": record["message"],
            "seconds": record.get("seconds")}


# -- the table and the expected failures ---------------------------------------------------


def counts(tests: dict[str, dict], baseline: bool) -> dict[str, int | None]:
    """The table's numbers for one suite; the CPU's in ``*_cpu`` (None without a baseline)."""
    row: dict[str, int | None] = dict.fromkeys(
        ("run", "passed", "failed", "skipped", "xfailed", "only_device", "both",
         "passed_cpu", "failed_cpu"), 0)
    for entry in tests.values():
        dev = entry[DEVICE]["outcome"]
        cpu = entry.get(BASELINE, {}).get("outcome")
        row["run"] += 1
        key = "failed" if dev in FAILED else dev
        row[key] += 1
        row["passed_cpu"] += cpu == "passed"
        row["failed_cpu"] += cpu in FAILED
        if dev in FAILED:
            row["both" if cpu in FAILED else "only_device"] += 1
    if not baseline:
        row["passed_cpu"] = row["failed_cpu"] = row["both"] = None
    return row


def format_table(results: dict) -> str:
    """A Markdown table: device counts, the CPU's in parentheses on the same tests."""
    lines = ["| suite | run | passed | failed | skipped | xfail | fails only on hologram "
             "| fails on both |", "|---|---|---|---|---|---|---|---|"]
    for name, suite in results["suites"].items():
        row = counts(suite["tests"], suite["baseline"])
        selection = f"{suite['fraction']:.0%}" if suite["fraction"] < 1 else "all"
        if suite.get("always"):
            selection += " + " + ", ".join(suite["always"])
        if suite.get("keyword"):
            selection += f" -k {suite['keyword']}"

        def pair(key, row=row):
            cpu = row[key + "_cpu"]
            return f"{row[key]}" if cpu is None else f"{row[key]} ({cpu})"

        both = "n/a" if row["both"] is None else row["both"]
        lines.append(f"| {suite['file']} ({name}), {selection} | {row['run']} | "
                     f"{pair('passed')} | {pair('failed')} | {row['skipped']} | "
                     f"{row['xfailed']} | {row['only_device']} | {both} |")
    return "\n".join(lines)


def load_expected(path: Path) -> dict[str, str]:
    """``TEST_ID  REASON`` per line (the device's node id, as the table's runs name it);
    blank lines and ``#`` comments are ignored. Every entry needs a reason."""
    expected: dict[str, str] = {}
    if not path.exists():
        return expected
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, reason = line.partition(" ")
        if not reason.strip():
            raise ValueError(f"{path}:{number}: {test_id} has no reason")
        if test_id in expected:
            raise ValueError(f"{path}:{number}: {test_id} is listed twice")
        expected[test_id] = reason.strip()
    return expected


# A first guess at the cause of a new failure, from its name and message (the list's
# reasons are written by a person; these only sort the output).
GUESSES = [
    (r"Timeout", "timeout: slower than the per-test limit"),
    (r"stride|channels_last|memory_format|is_contiguous", "strides: layout not propagated"),
    (r"[Ss]parse", "sparse: sparse tensors are not supported"),
    (r"[Qq]uantized", "quantized: quantized tensors are not supported"),
    (r"deterministic|uninitialized memory", "deterministic: memory is not filled"),
    (r"only implemented on CPU|Storage'>", "cpu-only: the test expects the CPU's behaviour"),
    (r"not raised|Raises|[Ee]xpected .*(Error|exception)|ShapeError",
     "errors: another exception type or none"),
    (r"Unexpected success", "unexpected success: PyTorch expects a failure"),
    (r"crashed|exit status|killed", "crash: the test process died"),
    (r"not close|not equal|mismatch", "values: results differ from the CPU"),
]


def guess_reason(test_id: str, message: str) -> str:
    for pattern, reason in GUESSES:
        if re.search(pattern, f"{test_id} {message}"):
            return reason
    return "unclassified"


@dataclass
class Comparison:
    new: list[tuple[str, str]] = field(default_factory=list)  # (id, message)
    stale: list[tuple[str, str]] = field(default_factory=list)  # (id, why)
    expected_seen: int = 0


def compare(results: dict, expected: dict[str, str]) -> Comparison:
    """New failures: fail on the device, not on the CPU, and are not listed. Stale entries:
    listed, ran on the device and did not fail there, or failed on the CPU too. Entries for
    tests that did not run (not sampled) are neither."""
    result = Comparison()
    for suite in results["suites"].values():
        for entry in suite["tests"].values():
            dev = entry[DEVICE]
            cpu_failed = entry.get(BASELINE, {}).get("outcome") in FAILED
            listed = entry["id"] in expected
            result.expected_seen += listed
            if dev["outcome"] in FAILED and not cpu_failed and not listed:
                result.new.append((entry["id"], dev["message"]))
            elif listed and dev["outcome"] not in FAILED:
                result.stale.append((entry["id"], f"{dev['outcome']} on {DEVICE} now"))
            elif listed and cpu_failed:
                result.stale.append((entry["id"], f"fails on {BASELINE} too"))
    return result


def prune_expected(path: Path, stale: set[str]) -> int:
    """Remove the stale entries from the list, keeping everything else as written."""
    kept, removed = [], 0
    for line in path.read_text().splitlines(keepends=True):
        if line.strip() and not line.lstrip().startswith("#") and line.split()[0] in stale:
            removed += 1
        else:
            kept.append(line)
    path.write_text("".join(kept))
    return removed


def report(results: dict, expected: dict[str, str], out=None) -> Comparison:
    """Print the table, the new failures and the stale entries; return the comparison."""
    out = out or sys.stdout
    comparison = compare(results, expected)
    print(format_table(results), file=out)
    print(f"\n{comparison.expected_seen} listed device failures ran", file=out)
    if comparison.new:
        print(f"\nNew failures ({len(comparison.new)}: fail on {DEVICE} only, not listed; "
              "lines for the list, with a guessed reason):", file=out)
        for test_id, message in sorted(comparison.new):
            print(f"{test_id}  {guess_reason(test_id, message)}\n    # {message}", file=out)
    if comparison.stale:
        print(f"\nStale entries ({len(comparison.stale)}: listed, no longer a device "
              "failure; --prune-expected removes them):", file=out)
        for test_id, why in sorted(comparison.stale):
            print(f"{test_id}  ({why})", file=out)
    return comparison


# -- command line --------------------------------------------------------------------------


def _git_commit(path: Path) -> str | None:
    """The checked-out commit, with a "+" when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                                  "--untracked-files=no"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + "+" if changed else head


def _parse_suite(text: str, default_fraction: float) -> tuple[Suite, float]:
    name, _, fraction = text.partition(":")
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; one of {', '.join(SUITES)}, all")
    return SUITES[name], float(fraction) if fraction else default_fraction


def _help_text(doc: str) -> str:
    """The module docstring for --help: prose paragraphs refilled, the example kept."""
    return "\n\n".join(p if p.startswith("    ") else textwrap.fill(" ".join(p.split()), 88)
                       for p in doc.strip().split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/pytorch_suites.py",
        description=_help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "suites (file, classes):\n" + "\n".join(
                f"  {s.name:14} {s.file} {' '.join(s.classes) or '(all classes)'}"
                f"{' ' + s.prefix + '*' if s.prefix else ''}"
                f"{'' if s.baseline else '  (no CPU baseline)'}"
                for s in SUITES.values())
            + "\n\nTable columns: device counts with the CPU's in parentheses on the same\n"
            "tests; 'fails only on hologram' fails on the device and not on the CPU.\n"
            "Outcomes: passed, failed (the call), error (setup/teardown), crashed (killed\n"
            "the process or hung), skipped, xfailed. The JSON (--out) holds each test's\n"
            "outcome and message on both devices and is updated suite by suite, so one\n"
            "suite at a time adds up to one table. Expected-failure list: one\n"
            "'TEST_ID  REASON' per line (the device's pytest node id). Exit status: 0,\n"
            "1 when there are new failures or stale entries, 2 on a run that failed.\n\n"
            "Run it niced, single-threaded, one suite at a time on a shared machine:\n"
            "  HOLOGRAM_NUM_THREADS=1 OMP_NUM_THREADS=1 nice -n 10 \\\n"
            "    python tools/pytorch_suites.py --pytorch-src ../pytorch --suite nn:0.5\n"
            "The per-test timeout needs pytest-timeout (in the 'test' extra)."))
    parser.add_argument("--pytorch-src", type=Path,
                        help="a PyTorch checkout (its test/ folder is used, read only)")
    parser.add_argument("--suite", action="append", default=[], metavar="NAME[:FRACTION]",
                        help="a suite to run, with its own sampled fraction (repeatable; "
                             "'all' for every suite)")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="fraction of tests kept, by the sha1 of the device-neutral test "
                             "name (the same tests on both devices and in every run; "
                             "default 1)")
    parser.add_argument("--always", action="append", default=[], metavar="SUBSTRING",
                        help="keep tests whose name contains this whatever the sample")
    parser.add_argument("-k", dest="keyword", help="pytest's -k expression, on both devices")
    parser.add_argument("--timeout", type=int, default=120,
                        help="seconds per test (pytest-timeout; default 120)")
    parser.add_argument("--stall", type=int, default=900,
                        help="kill a process in which no test finished for this many "
                             "seconds, and resume after the running test (default 900)")
    parser.add_argument("--wall-cap", type=float, default=0,
                        help="seconds per suite and device after which the rest is not run "
                             "(default: none)")
    parser.add_argument("--max-restarts", type=int, default=20,
                        help="processes restarted past crashed tests per suite and device")
    parser.add_argument("--no-baseline", action="store_true",
                        help="do not run the CPU (every device failure counts as new)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"results JSON, updated suite by suite (default "
                             f"{DEFAULT_OUT.relative_to(ROOT)}); logs sit beside it")
    parser.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED,
                        help="the list of expected device failures (default "
                             f"{DEFAULT_EXPECTED.relative_to(ROOT)})")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: the table and comparison of the --out JSON")
    parser.add_argument("--prune-expected", action="store_true",
                        help="remove the stale entries from the expected list")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.exists() else {"suites": {}}
    if not args.report_only:
        if args.pytorch_src is None or not (args.pytorch_src / "test").is_dir():
            parser.error("--pytorch-src must be a PyTorch checkout with a test/ folder")
        if not args.suite:
            parser.error("name at least one --suite (or --report-only)")
        try:
            import pytest_timeout  # noqa: F401
        except ImportError:
            parser.error("pytest-timeout is not installed: "
                         "pip install -c constraints.txt -e '.[test]'")
        names = [n for s in args.suite for n in (SUITES if s == "all" else [s])]
        try:
            plan = [_parse_suite(n, args.fraction) for n in names]
        except ValueError as e:
            parser.error(str(e))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="logs-", dir=args.out.parent))
        results["torch"] = importlib.metadata.version("torch")
        results["commit"] = _git_commit(ROOT)
        results["pytorch_src"] = str(args.pytorch_src)
        for suite, fraction in plan:
            opts = RunOptions(args.pytorch_src, workdir, fraction, tuple(args.always),
                              args.keyword, args.timeout, args.stall, args.wall_cap,
                              args.max_restarts)
            baseline = suite.baseline and not args.no_baseline
            try:
                device_outcomes, device_facts = run_suite(suite, DEVICE, opts)
                cpu_outcomes, cpu_facts = (run_suite(suite, BASELINE, opts) if baseline
                                           else (None, None))
            except SuiteError as e:
                print(e, file=sys.stderr)
                return 2
            results["suites"][suite.name] = {
                "file": suite.file, "fraction": fraction, "always": list(args.always),
                "keyword": args.keyword, "baseline": baseline,
                "date": datetime.date.today().isoformat(), "commit": results["commit"],
                "runs": {DEVICE: device_facts, BASELINE: cpu_facts},
                "tests": merge(suite, device_outcomes, cpu_outcomes)}
            args.out.write_text(json.dumps(results, indent=1) + "\n")
            print(f"{suite.name}: {device_facts} on {DEVICE}, {cpu_facts} on {BASELINE}; "
                  f"logs in {workdir}", file=sys.stderr)
    comparison = report(results, load_expected(args.expected))
    if args.prune_expected and comparison.stale:
        removed = prune_expected(args.expected, {t for t, _ in comparison.stale})
        print(f"\nremoved {removed} stale entries from {args.expected}")
    return 1 if comparison.new or comparison.stale else 0


if __name__ == "__main__":
    sys.exit(main())
