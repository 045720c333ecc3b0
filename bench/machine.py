"""What the benchmark ran on, how busy the rest of the machine was, a server's memory.

:class:`CpuMonitor` splits a window's CPU time into this benchmark's process tree and the
rest, so each result carries the share of the (shared) machine something else took.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

STUB = "triton_python_backend_stub"
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

    def _share(self, busy_s: float) -> float:
        return busy_s / (self.seconds * (os.cpu_count() or 1)) if self.seconds > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """Share of the machine's cores busy in the window, whoever used them (0..1)."""
        return self._share(self.total_busy_s)

    @property
    def foreign_share(self) -> float:
        """Share of the machine's cores used by processes outside the benchmark (0..1)."""
        return self._share(max(self.total_busy_s - self.own_busy_s, 0.0))


class CpuMonitor:
    """Measure a window: ``start()``, run something, ``stop()`` -> :class:`CpuWindow`."""

    def __init__(self, root: int | None = None):
        """``root`` is the PID whose process tree counts as ours (default: this process)."""
        self.root = root or os.getpid()
        self._start: tuple[float, float, float] | None = None

    def start(self) -> None:
        """Mark the start of a window."""
        self._start = (time.monotonic(), _total_busy_s(), _own_busy_s(self.root))

    def stop(self) -> CpuWindow:
        """End the window started by :meth:`start`."""
        if self._start is None:
            raise RuntimeError("stop() before start()")
        t0, busy0, own0 = self._start
        return CpuWindow(
            time.monotonic() - t0, _total_busy_s() - busy0, _own_busy_s(self.root) - own0
        )


def _cpuinfo(key: str) -> str:
    """The value of the first ``/proc/cpuinfo`` line that starts with ``key`` ('' if none)."""
    line = next((x for x in _read("/proc/cpuinfo").splitlines() if x.startswith(key)), "")
    return line.partition(":")[2].strip()


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
    flags = set(_cpuinfo("flags").split())
    return " ".join(f for f in SIMD_FLAGS if f in flags) or "unknown"


def machine_info() -> dict[str, str]:
    """CPU, cores, memory, OS and the versions of the packages that matter here."""
    mem_kb = _kib(_read("/proc/meminfo"), "MemTotal")
    info = {
        "cpu": _cpuinfo("model name") or platform.processor() or "unknown",
        "cores": str(os.cpu_count()),
        "cpu int8/fp16 features": _cpu_features(),
        "memory": f"{mem_kb / 1024 / 1024:.0f} GiB",
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }
    packages = ("nvidia-pytriton", "onnxruntime", "onnxruntime-gpu", "tritonclient", "tokenizers",
                "torch", "sentence-transformers", "transformers", "open-clip-torch")
    for package in packages:
        version = _version(package)
        if version != "not installed" or package != "onnxruntime-gpu":
            info[package] = version
    return info


def _kib(text: str, key: str) -> int:
    line = next((x for x in text.splitlines() if x.startswith(key + ":")), "")
    return int(line.split()[1]) if line else 0


def memory(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (private pages) of ``pid`` in KiB; PSS/USS 0 if unreadable."""
    try:
        rss = _kib(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
    except OSError:
        return {}
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        rollup = ""
    uss = _kib(rollup, "Private_Clean") + _kib(rollup, "Private_Dirty")
    return {"rss": rss, "pss": _kib(rollup, "Pss"), "uss": uss}


def server_processes(server_pid: int) -> dict[str, int]:
    """``{"tritonserver": pid, "<instance>": stub pid, ...}`` for one server."""
    found, pid = {"tritonserver": server_pid}, str(server_pid).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 8 and argv[0].endswith(STUB.encode()) and argv[5] == pid:
            found[argv[8].decode()] = int(entry.name)
    return found


def nvidia_smi(*query: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-<what>=... --format=csv,noheader,nounits``."""
    out = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]


def gpu_facts() -> dict:
    """The GPU, its driver, and the ONNX Runtime build that will drive it."""
    import onnxruntime as ort

    name, driver, memory = nvidia_smi("--query-gpu=name,driver_version,memory.total")[0]
    return {
        "gpu": name,
        "driver": driver,
        "gpu_memory_mib": int(memory),
        "cpu_cores": os.cpu_count(),
        "onnxruntime": ort.__version__,
        "ort_providers": ort.get_available_providers(),
        "python": sys.version.split()[0],
    }


class GpuSampler:
    """``nvidia-smi`` utilisation and memory every 200 ms, in a background process."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), util, mem))

    def window(self, start: float, end: float) -> dict:
        """Mean and max utilisation (%) and max memory (MiB) between two monotonic times."""
        inside = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not inside:
            return {"gpu_util_mean": None, "gpu_util_max": None, "gpu_mem_max_mib": None}
        utils = [u for u, _ in inside]
        return {
            "gpu_util_mean": round(sum(utils) / len(utils), 1),
            "gpu_util_max": max(utils),
            "gpu_mem_max_mib": max(m for _, m in inside),
        }

    def stop(self) -> None:
        """End the sampler."""
        self._proc.terminate()
        self._proc.wait(timeout=10)
