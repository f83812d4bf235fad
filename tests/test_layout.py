"""The package layout: every module imports on its own, the module-level import graph has no
cycle, and the layers import downward only (isa <- compiler <- backends <- runtime <- sdk).

The graph is read from each file's syntax tree: the imports a module runs when it is
imported (its top level, including ``if`` and ``try`` blocks, but not function bodies or
``if TYPE_CHECKING:`` blocks). An import of ``hologram.a.b`` is an edge to that module only,
not to the packages above it (as in grimp / import-linter).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hologram", "hologram_torch")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name>`` inside ``module``."""
    if not level:
        return name or ""
    base = module.split(".")
    base = base if _is_package(module) else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _top_level_imports(tree: ast.Module):
    """Import statements run when the module is imported (not in functions or classes)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                pending.extend(node.orelse)
            else:
                pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
        elif isinstance(node, ast.With):
            pending.extend(node.body)


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The package modules an import statement imports."""
    names = set()
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names}
    else:  # from base import a: the module base.a if there is one, else base itself
        base = _resolve(module, node.level, node.module)
        for alias in node.names:
            names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in names if name in MODULES}


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = set().union(*(_imported(name, node) for node in _top_level_imports(tree)))
        graph[name].discard(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_the_module_level_import_graph_is_acyclic():
    cycles = _cycles(import_graph())
    assert not cycles, "module-level import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# layer -> the packages it may import (besides itself).
ALLOWED = {
    "hologram.isa": ("hologram.errors",),
    "hologram.frontend": ("hologram.errors", "hologram.isa"),
    "hologram.compiler": ("hologram.errors", "hologram.config", "hologram.version",
                          "hologram.isa"),
    "hologram.codegen": ("hologram.errors", "hologram.config", "hologram.isa", "hologram.compiler"),
}
# layer -> the packages above it, which it must not import.
FORBIDDEN = {
    "hologram.backends": ("hologram.frontend", "hologram.runtime", "hologram.sdk",
                          "hologram.bench", "hologram_torch"),
    "hologram.runtime": ("hologram.sdk", "hologram.bench", "hologram_torch"),
    "hologram.sdk": ("hologram.bench", "hologram_torch"),
}


def _imports_of(layer: str):
    for module, targets in import_graph().items():
        if _in(module, layer):
            for target in sorted(targets):
                yield module, target


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_low_layers_import_only_what_is_below_them(layer):
    allowed = (layer, *ALLOWED[layer])
    wrong = [f"{module} imports {target}" for module, target in _imports_of(layer)
             if not any(_in(target, a) for a in allowed)]
    assert not wrong, f"{layer} may import only {', '.join(allowed)}: " + "; ".join(wrong)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_do_not_import_the_layers_above_them(layer):
    wrong = [f"{module} imports {target}" for module, target in _imports_of(layer)
             if any(_in(target, f) for f in FORBIDDEN[layer])]
    assert not wrong, "; ".join(wrong)


# Clients of the public API (the benchmark harness, the command line) may import it whole.
CLIENTS = ("hologram.bench", "hologram.cli", "hologram.__main__")


def test_no_module_imports_the_package_root():
    """``hologram/__init__.py`` only gathers public names: a module inside the package that
    imported it would depend on everything."""
    wrong = sorted(module for module, targets in import_graph().items()
                   if "hologram" in targets and _in(module, "hologram")
                   and not any(_in(module, c) for c in CLIENTS))
    assert not wrong, f"modules inside hologram import its root: {wrong}"


# Packages whose function-level imports must say why they are not at the top.
CORE = ("hologram.isa", "hologram.frontend", "hologram.compiler", "hologram.runtime",
        "hologram.sdk", "hologram.errors", "hologram.config", "hologram.version")


def test_lazy_imports_in_the_core_are_justified():
    """A function-level import of a package module hides a dependency: each one in the core
    layers carries a comment (on its line or the line above) saying why it is lazy."""
    bare = []
    for name, path in MODULES.items():
        if name != "hologram" and not any(_in(name, c) for c in CORE):
            continue
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        top = {id(node) for node in _top_level_imports(tree)}
        for node in ast.walk(tree):
            if (isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top
                    and _imported(name, node)):
                line, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                if "#" not in line and not above.startswith("#"):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {line.strip()}")
    assert not bare, "function-level imports without a reason:\n" + "\n".join(bare)


def test_every_module_imports_in_a_fresh_process():
    names = [name for name in MODULES if not name.endswith("__main__")]
    if importlib.util.find_spec("torch") is None:
        names = [name for name in names if not _in(name, "hologram_torch")]
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("configured", ["", "webgpu"])
def test_importing_torch_probes_no_gpu_backend(configured):
    """The device autoloads with ``import torch``: it must not look for GPU adapters then
    (loading a Vulkan driver costs time, and Mesa's brings a second LLVM into every
    process that imports torch), nor fail when ``HOLOGRAM_BACKEND`` names a GPU backend
    (which configures the SDK; the device computes on host memory)."""
    code = ("import torch, hologram_torch\n"
            "from hologram import backends\n"
            "probed = [n for n in backends.names() if n not in ('cpu', 'interp')\n"
            "          and getattr(backends.backend_class(n), '_available', None)]\n"
            "drivers = [line for line in open('/proc/self/maps') if 'libvulkan' in line]\n"
            "assert not probed and not drivers, (probed, drivers[:2])\n"
            "assert torch.ones(2, device='hologram').sum().item() == 2.0\n"
            "from hologram_torch.aten import runner\n"
            "assert runner.backend() == 'cpu', runner.backend()\n")
    if not Path("/proc/self/maps").exists():
        code = code.replace("open('/proc/self/maps')", "[]")
    env = {**os.environ, "HOLOGRAM_BACKEND": configured}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_importing_torch_imports_no_compiler_stack():
    """``import torch`` imports the device (the entry point): it must not pull in what only
    compiling needs — torch._dynamo and torch._inductor (with Triton: 7 s), lief (1 s)."""
    heavy = ("torch._dynamo", "torch._inductor", "triton", "lief")
    code = ("import sys, torch\n"
            "assert 'hologram_torch' in sys.modules\n"
            f"print([m for m in {heavy!r} if m in sys.modules])\n")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]"], done.stdout
