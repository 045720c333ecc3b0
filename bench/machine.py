"""What the benchmark ran on, and how busy the rest of the machine was meanwhile.

The machine is shared: :class:`CpuMonitor` measures, for a window, the CPU time used by
every process on the machine and by this benchmark's own process tree (the bench, the
servers it started and their children), so each result carries the share of the
machine that something else took while it ran.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _total_busy_s() -> float:
    fields = _read("/proc/stat").splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / CLK_TCK


def _process_table() -> dict[int, tuple[int, float]]:
    """Map each readable PID to (parent PID, user + system CPU seconds)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(f"/proc/{entry.name}/stat")
        if not stat:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        table[int(entry.name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK_TCK)
    return table


def _own_busy_s(root: int) -> float:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += table.get(pid, (0, 0.0))[1]
        stack.extend(children.get(pid, []))
    return total


@dataclass
class CpuWindow:
    """CPU use during one window: seconds of wall time, busy core-seconds."""

    seconds: float
    total_busy_s: float
    own_busy_s: float

    @property
    def busy_share(self) -> float:
        """Share of the machine's cores busy in the window, whoever used them (0..1)."""
        cores = os.cpu_count() or 1
        return self.total_busy_s / (self.seconds * cores) if self.seconds > 0 else 0.0

    @property
    def foreign_share(self) -> float:
        """Share of the machine's cores used by processes outside the benchmark (0..1)."""
        cores = os.cpu_count() or 1
        foreign = max(self.total_busy_s - self.own_busy_s, 0.0)
        return foreign / (self.seconds * cores) if self.seconds > 0 else 0.0


class CpuMonitor:
    """Measure a window: ``start()``, run something, ``stop()`` -> :class:`CpuWindow`."""

    def __init__(self, root: int | None = None):
        """``root`` is the PID whose process tree counts as ours (default: this process)."""
        self.root = root or os.getpid()
        self._start: tuple[float, float, float] | None = None

    def start(self) -> None:
        """Mark the start of a window."""
        import time

        self._start = (time.monotonic(), _total_busy_s(), _own_busy_s(self.root))

    def stop(self) -> CpuWindow:
        """End the window started by :meth:`start`."""
        import time

        if self._start is None:
            raise RuntimeError("stop() before start()")
        t0, busy0, own0 = self._start
        return CpuWindow(
            time.monotonic() - t0, _total_busy_s() - busy0, _own_busy_s(self.root) - own0
        )


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


SIMD_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_int8",
)


def _cpu_features() -> str:
    """The SIMD flags that decide ONNX Runtime's int8 and fp16 kernels (Linux only)."""
    line = next((x for x in _read("/proc/cpuinfo").splitlines() if x.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    return " ".join(f for f in SIMD_FLAGS if f in flags) or "unknown"


def machine_info() -> dict[str, str]:
    """CPU, cores, memory, OS and the versions of the packages that matter here."""
    mem_kb = next(
        (
            int(line.split()[1])
            for line in _read("/proc/meminfo").splitlines()
            if "MemTotal" in line
        ),
        0,
    )
    info = {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "cpu int8/fp16 features": _cpu_features(),
        "memory": f"{mem_kb / 1024 / 1024:.0f} GiB",
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }
    for package in (
        "nvidia-pytriton",
        "onnxruntime",
        "onnxruntime-gpu",
        "tritonclient",
        "tokenizers",
        "torch",
        "sentence-transformers",
        "transformers",
        "open-clip-torch",
    ):
        version = _version(package)
        if version != "not installed" or package != "onnxruntime-gpu":
            info[package] = version
    return info
