"""hologram.build: artifacts for any named target, without that target's device; compile is
build + load through the same cache entry."""

import lief
import numpy as np
import pytest

import hologram as hg
from hologram.backends.cpu import llvm
from hologram.backends.cpu import target as targets
from hologram.compiler import pipeline
from hologram.errors import HologramError
from hologram.frontend.graph import Graph
from hologram.isa import dtypes as dt


def _program():
    g = Graph("scaled_exp")
    x = g.input("x", dt.float32, (3, 50))
    g.output("y", g.unary("exp", x) * 2.0)
    return g.program()


@pytest.mark.parametrize("name", ["x86-64-v3", "sapphirerapids", "neoverse-v1", "apple-m1"])
def test_cpu_artifacts_for_other_machines(name):
    artifact = hg.build(_program(), backend="cpu", target=name)
    assert artifact.backend == "cpu"
    assert artifact.target == targets.named(name).identity
    meta = artifact.metadata
    assert meta["format"] == "object code" and meta["object_bytes"] > 0
    assert meta["interpreted"] == []
    # The object really is code for that architecture, and calls nothing outside it.
    obj = artifact.data[-meta["object_bytes"]:]
    llvm.check_object(obj, targets.named(name), llvm.PROCESS_SYMBOLS)
    machine = "aarch64" if name in ("neoverse-v1", "apple-m1") else "x86_64"
    assert machine in str(lief.parse(obj).header.machine_type).lower()


def test_build_is_cached_and_compile_shares_the_entry(tmp_path, monkeypatch):
    g = Graph("row_max")
    x = g.input("x", dt.float32, (3, 50))
    g.output("y", g.max(g.unary("exp", x), 1))
    program = g.program()
    first = hg.build(program, backend="cpu")
    again = hg.build(program, backend="cpu")
    assert first.key == again.key and first.data == again.data
    compiled = hg.compile(program, backend="cpu")
    assert compiled.key == first.key
    data = np.linspace(-3, 3, 150, dtype=np.float32).reshape(3, 50)
    np.testing.assert_allclose(compiled(data), np.exp(data).max(1), rtol=2e-6)


def test_an_elementwise_program_is_built_at_its_own_length():
    """compile runs an elementwise program's template (docs/compiler.md, "Generic
    lengths"); build's artifact is the program itself, to load anywhere."""
    program = _program()
    built = hg.build(program, backend="cpu")
    assert built.metadata["steps"][0]["rows"] == 150
    compiled = hg.compile(program, backend="cpu")
    canonical = pipeline.canonical_form(program)
    assert built.key.program == canonical.fingerprint() != compiled.key.program
    x = np.linspace(-3, 3, 150, dtype=np.float32).reshape(3, 50)
    np.testing.assert_allclose(compiled(x), np.exp(x) * 2, rtol=2e-6)


def test_the_target_is_part_of_the_key():
    program = _program()
    keys = {hg.build(program, "cpu", name).key.digest() for name in ("x86-64", "x86-64-v3")}
    assert len(keys) == 2


def test_unknown_targets_are_refused_with_the_known_names():
    with pytest.raises(HologramError, match="neoverse-v1"):
        hg.build(_program(), backend="cpu", target="pentium-4")
    with pytest.raises(HologramError, match="one target"):
        hg.build(_program(), backend="interp", target="sm_90")


def test_interp_artifact_is_program_text():
    artifact = hg.build(_program(), backend="interp")
    assert artifact.metadata["format"] == "atlas text"
    assert b"kernel" in artifact.data
