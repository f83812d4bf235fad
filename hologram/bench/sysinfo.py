"""``collect_system_info()``: the machine and library versions a benchmark ran with."""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time

import numpy as np


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_freq_mhz() -> float:
    """Current frequency (the first core's), NaN when the OS does not say."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq") as f:
            return int(f.read()) / 1e3
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return float("nan")


def _physical_cores() -> int | None:
    """Distinct (socket, core) pairs in /proc/cpuinfo; os.cpu_count() when it lists none."""
    pairs: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":", 1)[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":", 1)[1].strip()
                    pairs.add((phys or "0", core))
    except OSError:
        pass
    return len(pairs) or os.cpu_count()


def _memory_total_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return float("nan")


def memory_available_bytes() -> int | None:
    """Memory this process can still take without swapping: ``MemAvailable`` from
    /proc/meminfo (psutil's reading elsewhere), lowered to what the cgroup's limit leaves
    (containers); None when neither says."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if available is None:
        try:
            import psutil
        except ImportError:
            return None
        available = int(psutil.virtual_memory().available)
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def available_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _busy_ticks() -> tuple[int, int] | None:
    """(clock ticks all CPUs spent busy, ticks this process spent), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        with open("/proc/self/stat") as own:
            after_name = own.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait
    return busy, int(after_name[11]) + int(after_name[12])  # utime + stime


class OtherLoad:
    """Cores kept busy by other processes (CPU time of the machine minus this process's)
    between :meth:`start` and :meth:`cores`; None where /proc is missing or the interval
    was under :attr:`MIN_WINDOW_S` (the kernel counts in clock ticks, 10 ms apart: over a
    few ms, one tick reads as several cores)."""

    MIN_WINDOW_S = 0.2

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._ticks, self._wall = _busy_ticks(), time.perf_counter()

    def cores(self) -> float | None:
        now = _busy_ticks()
        wall = time.perf_counter() - self._wall
        if now is None or self._ticks is None or wall < self.MIN_WINDOW_S:
            return None
        ticks = (now[0] - self._ticks[0]) - (now[1] - self._ticks[1])
        return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / wall)


def wait_for_quiet(limit_s: float, threshold: float = 0.3) -> float:
    """Wait (up to ``limit_s``) until other processes use less than ``threshold`` cores over
    a 0.2 s window; return the seconds waited. The machine is shared: another job on one
    of two cores turns each parallel call into a wait for a time slice."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        load = OtherLoad()
        time.sleep(0.2)
        busy = load.cores()
        if busy is None or busy < threshold:
            break
    return time.perf_counter() - start


def collect_system_info() -> dict:
    """Keys: platform, python_version, cpu_model, cpu_cores_physical, cpu_cores_logical,
    cpu_cores_available (this process's affinity), cpu_freq_mhz, memory_total_gb,
    numpy_version, torch_version, torch_num_threads, hologram_version, hologram_backend,
    hologram_num_threads, load_average (1-minute, other processes included: a value near
    the core count means the timings shared the machine), timestamp (ISO 8601, local time
    with offset)."""
    import hologram
    from hologram.sdk.backend import validate_backend

    try:
        import torch

        torch_version, torch_threads = torch.__version__, torch.get_num_threads()
    except ImportError:
        torch_version, torch_threads = "not installed", 0
    return {
        "platform": platform.platform(),
        "python_version": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpu_cores_physical": _physical_cores(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_available": available_cores(),
        "cpu_freq_mhz": _cpu_freq_mhz(),
        "memory_total_gb": _memory_total_gb(),
        "numpy_version": np.__version__,
        "torch_version": torch_version,
        "torch_num_threads": torch_threads,
        "hologram_version": hologram.__version__,
        "hologram_backend": str(validate_backend("auto")),
        "hologram_num_threads": hologram.get_num_threads(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
