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

from .integrity import IntegrityError, verify_digests, write_digests

WEIGHT_CACHE_ENV = "EMBED_ORT_CACHE_DIR"
_CACHED_MODEL, _CACHED_WEIGHTS = "model.onnx", "weights.bin"
CACHE_UNUSED_DAYS = 7  # a copy no server loaded for this long is removed by the next write


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
