"""``hologram info`` (text and ``--json``), ``python -m hologram info`` and
``hologram.info()``: what they report, and that a broken part does not take the report
down."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import hologram
from hologram import about, backends
from hologram.backends.interp.backend import InterpBackend

SECTIONS = {"hologram", "python", "torch", "cpu", "backends", "cache", "native", "threads",
            "environment"}


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hologram", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


@pytest.fixture(scope="module")
def report_json(tmp_path_factory) -> dict:
    # A variable the config knows, one it does not (a typo a bug report should show), and an
    # empty cache directory of our own (a user's may hold many entries to count).
    cache = tmp_path_factory.mktemp("cache")
    done = _run("info", "--json", HOLOGRAM_FAST_MATH="0", HOLOGRAM_NUM_THRAEDS="3",
                HOLOGRAM_CACHE_DIR=str(cache))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_json_has_every_section_and_no_errors(report_json):
    assert set(report_json) == SECTIONS
    for name, section in report_json.items():
        assert "error" not in section, (name, section)
    assert report_json["hologram"]["version"] == hologram.__version__
    assert report_json["hologram"]["distribution"] == "hologram-tensor"
    assert report_json["hologram"]["installed_version"] == hologram.__version__
    assert report_json["hologram"]["cache_version"].startswith(hologram.__version__ + "+")
    assert (report_json["cache"]["disk_entries"], report_json["cache"]["disk_bytes"]) == (0, 0)


def test_json_environment_lists_every_hologram_variable_set(report_json):
    environment = report_json["environment"]
    assert environment["HOLOGRAM_FAST_MATH"] == "0"
    assert environment["HOLOGRAM_NUM_THRAEDS"] == "3"
    assert all(name.startswith("HOLOGRAM_") for name in environment)


def test_json_backends_say_why_not(report_json):
    entries = {entry["name"]: entry for entry in report_json["backends"]["list"]}
    assert set(entries) == set(backends.names())
    assert entries["cpu"]["available"] and entries["interp"]["available"]
    assert report_json["backends"]["default"] in entries
    for entry in entries.values():
        # every backend that is unavailable, or that "auto" passes over, says why
        assert (entry["reason"] is None) == (entry["available"] and entry["auto"]), entry
        assert entry["reason"] is None or len(entry["reason"]) > 10


@pytest.mark.needs_torch
def test_json_torch(report_json):
    import torch

    assert report_json["torch"]["version"] == torch.__version__
    assert report_json["torch"]["supported"] == "torch<2.14,>=2.13"
    assert report_json["torch"]["matches"] is True
    hooks = report_json["native"]["torch_hooks"]
    assert hooks["origin"] in ("prebuilt", "built")
    assert hooks["active"] is (hooks["reason"] is None)


def test_json_cpu_native_threads(report_json):
    cpu = report_json["cpu"]
    assert cpu["target"] == "host" and cpu["target_runnable"] is True
    assert set(cpu["notable_features"]) <= set(cpu["features"])
    native = report_json["native"]
    assert native["hologram._native"]["loaded"] is True
    assert report_json["threads"]["hologram"] >= 1
    assert report_json["threads"]["available_cores"] >= 1


def test_text_form_names_every_backend():
    done = _run("info")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["hologram", hologram.__version__]
    for name in backends.names():
        assert any(line.split()[0] == name for line in lines), name
    assert "error:" not in done.stdout


def test_version_option():
    done = _run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"hologram {hologram.__version__} (hologram-tensor)"


def test_info_is_the_collector():
    assert hologram.info is about.collect


class _Missing(InterpBackend):
    @classmethod
    def is_available(cls) -> bool:
        return False

    @classmethod
    def unavailable_reason(cls) -> str:
        return "no frobnicator here: apt-get install frobnicator"


@pytest.fixture
def missing_backend():
    backends.register("missing", _Missing)
    yield
    backends.unregister("missing")


def test_unavailable_backend_reason_in_both_forms(missing_backend):
    report = about.collect()
    entry = next(e for e in report["backends"]["list"] if e["name"] == "missing")
    assert entry == {"name": "missing", "available": False, "auto": False,
                     "reason": "no frobnicator here: apt-get install frobnicator"}
    assert ("unavailable: no frobnicator here: apt-get install frobnicator"
            in about.render(report))


def test_a_failing_section_is_reported_and_the_rest_kept(monkeypatch):
    def broken():
        raise RuntimeError("driver on fire")

    monkeypatch.setattr(about, "_cpu", broken)
    report = about.collect()
    assert report["cpu"] == {"error": "RuntimeError: driver on fire"}
    assert "error" not in report["backends"]
    text = about.render(report)
    assert "error: RuntimeError: driver on fire" in text


def test_bad_cpu_target_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("HOLOGRAM_CPU_TARGET", "pentium-pro")
    report = about.collect()
    assert report["cpu"]["target"] == "pentium-pro"
    assert "not a known CPU target" in report["cpu"]["target_problem"]
    assert "HOLOGRAM_CPU_TARGET=pentium-pro (" in about.render(report)


def test_cache_section_counts_this_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    entry = tmp_path / "ab" / ("ab" + "0" * 62 + ".bin")
    entry.parent.mkdir()
    entry.write_bytes(b"x" * 1000)
    cache = about.collect()["cache"]
    assert cache["directory"] == str(tmp_path)
    assert (cache["disk_entries"], cache["disk_bytes"]) == (1, 1000)
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    assert "memory only" in about.render(about.collect())
