"""The host weight cache: each encoder graph optimised once per host.

Every stub of the host then memory-maps the same optimised copy (its packed weights are
shared pages), checked against the digests written with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import stat
import tempfile
import time

from .external_data import align_external_data
from .integrity import IntegrityError, verify_digests, write_digests

WEIGHT_CACHE_ENV = "EMBED_ORT_CACHE_DIR"
_CACHED_MODEL, _CACHED_WEIGHTS = "model.onnx", "weights.bin"
CACHE_UNUSED_DAYS = 7  # a copy no server loaded for this long is removed by the next write
# The layout of a written copy; part of the key, so copies of an older layout (version 1:
# blobs as ONNX Runtime wrote them, unaligned) are never loaded again.
CACHE_LAYOUT = 2


def graph_level(ort, name: str):
    """ONNX Runtime's enum for a manifest level (disable/basic/extended/all)."""
    return {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[name]


def weight_cache_root(env: dict[str, str] | None = None) -> str:
    """Where host-optimised models live: ``$EMBED_ORT_CACHE_DIR``, else a private temp folder."""
    env = os.environ if env is None else env
    default = os.path.join(tempfile.gettempdir(), f"embed-ort-cache-{os.getuid()}")
    return env.get(WEIGHT_CACHE_ENV) or default


def private_dir(path: str) -> str:
    """Create ``path`` (mode 0700) or accept it only when it is this user's and private.

    Anything else sharing the temp folder could otherwise plant a graph for this server
    to load, so a folder owned by someone else, a symlink, or one that group or others
    can write is refused (:class:`PermissionError`).
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"weight cache {path} must be a directory of uid {os.getuid()} with mode 0700"
        )
    return path


def _cpu_flags() -> str:
    """The instruction-set flags the optimised graph and its packed weights depend on."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def host_key(model_path: str, graph_optimization: str) -> str:
    """Cache key: the graph's bytes (and external ``.data`` files), ORT, level and CPU."""
    import onnxruntime as ort  # noqa: PLC0415 - serve-time dependency

    digest = hashlib.sha256()
    with open(model_path, "rb") as model:
        for block in iter(lambda: model.read(1 << 20), b""):
            digest.update(block)
    folder = os.path.dirname(os.path.abspath(model_path))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".data"):
            info = os.stat(os.path.join(folder, name))
            digest.update(f"{name}:{info.st_size}:{info.st_mtime_ns}".encode())
    host = f"{ort.__version__}|{graph_optimization}|{platform.machine()}|{_cpu_flags()}"
    host += f"|layout {CACHE_LAYOUT}"
    digest.update(host.encode())
    return digest.hexdigest()[:32]


def _intact(final: str, target: str, on_repair) -> bool:
    """Whether the cached copy exists and matches the digests written with it.

    A copy that fails its check (flipped bytes on disk, a copy from before digests) is
    reported through ``on_repair`` and treated as absent, so it is rewritten, never loaded.
    """
    if not os.path.isfile(target):
        return False
    try:
        verify_digests(final, required=True)
    except IntegrityError as exc:
        if on_repair is not None:
            on_repair(f"weight cache copy rewritten: {exc}")
        return False
    return True


def cached_model(
    model_path: str, graph_optimization: str = "all", root: str | None = None, on_repair=None
) -> str:
    """This host's optimised copy of ``model_path``, written once and then shared.

    ONNX Runtime optimises the graph and re-packs the weights of every MatMul/Conv into
    its kernels' layout when a session is created, in that session's private memory: two
    encoder instances, with two sessions each, held four copies of the same weights, and
    a lone request that landed on the other instance found them out of cache (measured
    in docs/deployment.md). The copy written here holds the optimised graph and
    the packed weights in one file that every session of every instance memory-maps: one
    copy in RAM and in the CPU caches. The packed layout depends on the CPU, so the key
    names the CPU's flags and ONNX Runtime's version; the first instance writes it under
    a lock, into a folder renamed into place when complete, with the SHA-256 of every
    file it holds; a load checks them first, and a copy that fails is rewritten.

    ONNX Runtime writes the blobs of the weights file back to back; a session maps the
    file and runs MLAS's kernels on the pre-packed blobs in place, with aligned loads. So
    the blobs are moved onto 64-byte boundaries before the digests are taken
    (``external_data.py``): one odd-sized initializer (SPLADE's 30,522-float decoder
    bias) had put every later pre-packed MatMul weight 8 bytes off and crashed the stub.
    """
    import onnxruntime as ort  # noqa: PLC0415 - serve-time dependency

    root = private_dir(root or weight_cache_root())
    key = host_key(model_path, graph_optimization)
    final = os.path.join(root, key)
    target = os.path.join(final, _CACHED_MODEL)
    if _intact(final, target, None):
        os.utime(final)  # last use, for prune_cache
        return target
    with open(os.path.join(root, f"{key}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _intact(final, target, on_repair):  # written (or repaired) while this one waited
            os.utime(final)
            return target
        shutil.rmtree(final, ignore_errors=True)  # a corrupt copy: never loaded, rewritten
        work = tempfile.mkdtemp(prefix=f"{key}.", dir=root)
        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.log_severity_level = 3  # not its "hardware specific" warning: it is meant
            options.graph_optimization_level = graph_level(ort, graph_optimization)
            options.optimized_model_filepath = os.path.join(work, _CACHED_MODEL)
            for name, value in (
                ("session.optimized_model_external_initializers_file_name", _CACHED_WEIGHTS),
                ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
                ("session.save_external_prepacked_constant_initializers", "1"),
            ):
                options.add_session_config_entry(name, value)
            cpu = ["CPUExecutionProvider"]
            ort.InferenceSession(model_path, sess_options=options, providers=cpu)
            if os.path.isfile(os.path.join(work, _CACHED_WEIGHTS)):
                # every blob on 64 bytes, or MLAS faults on a mapped pre-packed weight
                align_external_data(os.path.join(work, _CACHED_MODEL), _CACHED_WEIGHTS)
            write_digests(work, os.listdir(work))
            os.rename(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    prune_cache(root, keep=key)
    return target


def prune_cache(root: str, keep: str = "", days: float = CACHE_UNUSED_DAYS) -> list[str]:
    """Remove the copies in ``root`` that no session loaded for ``days``; returns their keys.

    Every load marks its copy used, so only graphs that were replaced or removed (a new
    export has a new key) age out. A copy is removed under its own lock, so an instance
    loading it at that moment either finds it whole or writes it again.
    """
    removed = []
    cutoff = time.time() - days * 86400
    for entry in os.scandir(root):
        if entry.name == keep or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            if "." in entry.name:  # the work folder of a write that never finished
                shutil.rmtree(entry.path)
                continue
            with open(os.path.join(root, f"{entry.name}.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if os.stat(entry.path).st_mtime < cutoff:
                    shutil.rmtree(entry.path)
                    removed.append(entry.name)
        except OSError:
            continue
    return removed


def _probe_feeds(session, vocab_size: int = 0) -> dict:
    """Inputs for one run of ``session``: two rows, seven positions where a dim is free.

    Token ids stay below ``vocab_size`` (100 when unknown); masks are ones with the
    second row padded; type ids are zeros; float inputs are seeded normal values.
    """
    import numpy as np  # noqa: PLC0415 - serve-time dependency

    rng = np.random.default_rng(0)
    dtypes = {
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(double)": np.float64,
        "tensor(bool)": bool,
    }
    feeds = {}
    for arg in session.get_inputs():
        shape = [
            d if isinstance(d, int) and d > 0 else (2 if i == 0 else 7)
            for i, d in enumerate(arg.shape)
        ]
        dtype = dtypes.get(arg.type, np.float32)
        name = arg.name.lower()
        if np.dtype(dtype).kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif "mask" in name:
            value = np.ones(shape, dtype)
            if len(shape) == 2 and shape[0] > 1 and shape[1] > 2:
                value[1, shape[1] // 2 :] = 0
        elif "type" in name or np.dtype(dtype).kind == "b":
            value = np.zeros(shape, dtype)
        else:
            value = rng.integers(1, max(2, min(vocab_size or 100, 100)), shape).astype(dtype)
        feeds[arg.name] = value
    return feeds


def compare_cached_copy(
    model_path: str, graph_optimization: str = "all", vocab_size: int = 0
) -> str:
    """What differs when ``model_path`` runs from a fresh cached copy ("" when nothing).

    Both sessions open as a stub opens them (``OrtEncoder``): the plain graph at
    ``graph_optimization``, the cached copy with optimisation off.

    Runs in this process: a copy that crashes ONNX Runtime ends it. The build calls
    :func:`check_cached_copy`, which runs this in a child process.
    """
    import numpy as np  # noqa: PLC0415 - serve-time dependency
    import onnxruntime as ort  # noqa: PLC0415

    def session(path: str, level: str):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = graph_level(ort, level)
        return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

    plain = session(model_path, graph_optimization)
    feeds = _probe_feeds(plain, vocab_size)
    want = plain.run(None, feeds)
    with tempfile.TemporaryDirectory(prefix="embed-cache-check-") as root:
        os.chmod(root, 0o700)
        copy = cached_model(model_path, graph_optimization, root=root)
        got = session(copy, "disable").run(None, feeds)
    for arg, a, b in zip(plain.get_outputs(), got, want, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {arg.name}: shape {a.shape} from the cached copy, {b.shape} plain"
        if a.dtype.kind == "f":
            diff = float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
            scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
            if not diff <= 1e-5 * scale:  # NaN fails too
                return f"output {arg.name}: the cached copy differs by {diff:.3g} (max abs)"
        elif not np.array_equal(a, b):
            return f"output {arg.name}: the cached copy's values differ"
    return ""


def check_cached_copy(
    model_path: str, graph_optimization: str = "all", vocab_size: int = 0, timeout_s: float = 900.0
) -> str:
    """:func:`compare_cached_copy` in a child process: "" when the copy runs equal.

    A crash (the SIGSEGV that an unaligned pre-packed weight caused) or a difference is
    returned as a sentence naming it, so the build can refuse the graph instead of
    leaving it to kill every stub that loads it.
    """
    import signal  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    code = (
        "import faulthandler, sys; faulthandler.enable()\n"
        "from embed_runtime.ops.weight_cache import compare_cached_copy\n"
        "problem = compare_cached_copy(sys.argv[1], sys.argv[2], int(sys.argv[3]))\n"
        "print(problem); sys.exit(1 if problem else 0)\n"
    )
    args = [sys.executable, "-c", code, model_path, graph_optimization, str(vocab_size)]
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter, our own code
            args, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return f"the cached copy did not finish one run within {timeout_s:g} s"
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        tail = done.stderr.strip().splitlines()[-3:]
        return f"ONNX Runtime crashed ({name}) running the cached copy: {' | '.join(tail)}"
    if done.returncode:
        lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
        return lines[-1] if lines else f"the check exited with status {done.returncode}"
    return ""
