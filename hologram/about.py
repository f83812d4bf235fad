"""What this installation is and what it can run here: ``hologram info`` (``--json`` for
bug reports), ``python -m hologram info`` and :func:`hologram.info`.

:func:`collect` returns one JSON-serializable dict; :func:`render` prints it for people.
Each section is gathered on its own: one that fails (a broken driver, a damaged torch) is
reported with its error, and the others still are, since a report is most needed when
something is broken.

Sections: ``hologram`` (version, distribution, location, the program cache's key version),
``python``, ``torch`` (version, C++ ABI, whether it is the release this package supports),
``cpu`` (model, architecture, LLVM's name, SIMD features, ``HOLOGRAM_CPU_TARGET``),
``backends`` (each with available / unavailable and why, and whether ``"auto"`` takes it),
``cache``, ``native`` (``hologram._native`` and the torch device's C++ hooks: loaded or not,
why, prebuilt or built here), ``threads``, and ``environment`` (every ``HOLOGRAM_*``
variable set).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from collections.abc import Callable
from typing import Any

from hologram import config
from hologram.errors import HologramError
from hologram.version import DISTRIBUTION, __version__

#: The SIMD and math features worth a line in the text form, in this order (LLVM's names);
#: the JSON lists every feature LLVM reports.
_NOTABLE_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                     "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "amx-tile",
                     "neon", "fullfp16", "dotprod", "bf16", "sve", "sve2")


def _section(gather: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return gather()
    except Exception as exc:  # a report must survive any broken part
        return {"error": f"{type(exc).__name__}: {exc}"}


def _hologram() -> dict[str, Any]:
    from hologram.compiler.cache import compiler_version

    try:
        installed = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    return {"version": __version__, "distribution": DISTRIBUTION,
            "installed_version": installed,
            "location": str(importlib.util.find_spec("hologram").submodule_search_locations[0]),
            "cache_version": compiler_version()}


def _python() -> dict[str, Any]:
    return {"version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable, "platform": platform.platform()}


def supported_torch() -> str | None:
    """The torch requirement of this distribution's ``torch`` extra (``torch>=2.13,<2.14``),
    or None when the distribution's metadata is not installed (a bare checkout)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if spec.strip().startswith("torch") and "torch" in marker.replace("extra", ""):
            return spec.strip()
    return None


def _torch() -> dict[str, Any]:
    supported = supported_torch()
    if importlib.util.find_spec("torch") is None:
        return {"installed": False, "supported": supported,
                "reason": f"not installed: pip install '{DISTRIBUTION}[torch]'"}
    import torch

    version = torch.__version__
    info = {"installed": True, "version": str(version), "git_version": torch.version.git_version,
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI), "supported": supported,
            "matches": None}
    if supported is not None:
        from packaging.requirements import Requirement

        release = str(version).split("+", 1)[0]
        info["matches"] = Requirement(supported).specifier.contains(release, prereleases=True)
    return info


def _cpu_model() -> str:
    """/proc/cpuinfo's model name, else what the platform module reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu() -> dict[str, Any]:
    from hologram.backends.cpu import target

    host = target.host()
    features = sorted(target.host_features())
    selected = config.get().cpu_target
    info = {"model": _cpu_model(), "architecture": host.arch, "triple": host.triple,
            "llvm_cpu": host.cpu, "features": features,
            "notable_features": [f for f in _NOTABLE_FEATURES if f in features],
            "target": selected, "target_runnable": None, "target_problem": None}
    try:
        chosen = target.current()
        info["target_runnable"] = chosen.runnable_here()
        if not chosen.runnable_here():
            chosen.check_runnable()
    except HologramError as exc:  # an unknown or unrunnable target is reported
        info["target_problem"] = str(exc)
    return info


def _backend(name: str) -> dict[str, Any]:
    from hologram import backends

    cls = backends.backend_class(name)
    available = cls.is_available()
    entry = {"name": name, "available": available, "auto": cls.auto_available(),
             "reason": None}
    if not available:
        why = getattr(cls, "unavailable_reason", None)
        entry["reason"] = why() if why is not None else "is_available() is false"
    elif not entry["auto"]:
        entry["reason"] = _not_auto_reason(name)
    return entry


def _not_auto_reason(name: str) -> str:
    """Why ``"auto"`` passes over a backend that runs here: the backend's own class method
    ``not_auto_reason``, where it has one."""
    from hologram import backends

    why = getattr(backends.backend_class(name), "not_auto_reason", None)
    return why() if why is not None else "the backend declines 'auto' here"


def _backends() -> dict[str, Any]:
    from hologram import backends

    entries = [_section(lambda n=name: _backend(n)) for name in backends.names()]
    for name, entry in zip(backends.names(), entries):
        entry.setdefault("name", name)
    try:
        default = backends.validate_backend("auto")
    except HologramError as exc:  # a bad HOLOGRAM_BACKEND is reported
        default = f"error: {exc}"
    return {"default": default, "list": entries}


def _cache() -> dict[str, Any]:
    from hologram.compiler.cache import default_cache

    settings = config.get()
    info = default_cache().info()
    return {"directory": info["directory"], "disk_enabled": settings.disk_cache,
            "disk_entries": info["disk_entries"], "disk_bytes": info["disk_bytes"],
            "memory_entries_max": settings.cache_size, "last_disk_error": info["last_disk_error"]}


def _native() -> dict[str, Any]:
    try:
        from hologram import _native as extension
    except ImportError as exc:
        core = {"loaded": False, "path": None, "reason": str(exc)}
    else:
        core = {"loaded": True, "path": extension.__file__, "reason": None}
    return {"hologram._native": core, "torch_hooks": _section(_torch_hooks)}


def _torch_hooks() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"active": False, "reason": "torch is not installed"}
    # Importing torch registers the device (the package's torch.backends entry point), which
    # loads the hooks, or builds them once where there is a compiler: what any torch user's
    # first import does.
    import hologram_torch.native as hooks

    return hooks.state()


def _threads() -> dict[str, Any]:
    import hologram
    from hologram.backends.cpu import blas

    info = {"hologram": hologram.get_num_threads(), "available_cores": config.available_cores(),
            "blas": blas.blas_threads(), "blas_library": blas.describe()}
    if "torch" in sys.modules:
        info["torch"] = sys.modules["torch"].get_num_threads()
    return info


def collect() -> dict[str, Any]:
    """Everything ``hologram info`` reports, as a JSON-serializable dict (see the module
    docstring for its sections). Never raises: a section that fails holds ``error``."""
    report = {"hologram": _section(_hologram), "python": _section(_python),
              "torch": _section(_torch)}
    report["cpu"] = _section(_cpu)
    report["backends"] = _section(_backends)
    report["cache"] = _section(_cache)
    report["native"] = _section(_native)
    report["threads"] = _section(_threads)
    report["environment"] = config.environment()
    return report


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""  # unreachable


def _lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows of the text form, one section after another."""
    rows: list[tuple[str, str]] = []

    def add(label: str, section: dict[str, Any], text: Callable[[dict[str, Any]], str]):
        rows.append((label, f"error: {section['error']}" if "error" in section else text(section)))

    add("hologram", report["hologram"], lambda s: (
        f"{s['version']} ({s['distribution']} "
        f"{s['installed_version'] or 'metadata not installed'}) at {s['location']}"))
    add("python", report["python"], lambda s: (
        f"{s['version']} ({s['implementation']}, {s['executable']}) on {s['platform']}"))

    def torch_text(s: dict[str, Any]) -> str:
        if not s["installed"]:
            return s["reason"]
        match = {True: "supported", False: f"NOT the supported {s['supported']}",
                 None: "supported range unknown (package metadata not installed)"}[s["matches"]]
        return f"{s['version']} (cxx11 ABI {'on' if s['cxx11_abi'] else 'off'}; {match})"

    add("torch", report["torch"], torch_text)

    def cpu_text(s: dict[str, Any]) -> str:
        features = " ".join(s["notable_features"]) or "none of the notable SIMD features"
        target = s["target"] if s["target_problem"] is None else (
            f"{s['target']} ({s['target_problem']})")
        return (f"{s['model']} ({s['architecture']}, LLVM {s['llvm_cpu']}); {features}; "
                f"HOLOGRAM_CPU_TARGET={target}")

    add("cpu", report["cpu"], cpu_text)
    backends = report["backends"]
    if "error" in backends:
        rows.append(("backends", f"error: {backends['error']}"))
    else:
        rows.append(("backends", f"'auto' selects {backends['default']}"))
        for entry in backends["list"]:
            if "error" in entry:
                state = f"error: {entry['error']}"
            elif entry["available"]:
                state = "available" + ("" if entry["auto"] else f", not for 'auto': "
                                                                 f"{entry['reason']}")
            else:
                state = f"unavailable: {entry['reason']}"
            rows.append((f"  {entry['name']}", state))
    add("cache", report["cache"], lambda s: (
        f"{s['directory']}: {s['disk_entries']} entries, {_size(s['disk_bytes'])}"
        if s["disk_enabled"] else "memory only (HOLOGRAM_DISABLE_DISK_CACHE=1)"))
    native = report["native"]
    if "error" in native:
        rows.append(("native", f"error: {native['error']}"))
    else:
        core = native["hologram._native"]
        rows.append(("native", f"hologram._native {'loaded' if core['loaded'] else 'MISSING'}: "
                               f"{core['path'] or core['reason']}"))
        add("  torch hooks", native["torch_hooks"], lambda s: (
            f"active ({s['origin']}: {s['path']})" if s["active"]
            else f"inactive: {s['reason']}"))
    add("threads", report["threads"], lambda s: (
        f"hologram {s['hologram']}, torch {s.get('torch', '-')}, BLAS {s['blas']} "
        f"({s['blas_library']}); {s['available_cores']} cores available"))
    environment = report["environment"]
    rows.append(("environment", " ".join(f"{k}={v}" for k, v in environment.items())
                 or "no HOLOGRAM_* variable set"))
    return rows


def render(report: dict[str, Any]) -> str:
    """The text form of :func:`collect`'s report, one aligned line per item."""
    rows = _lines(report)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)
