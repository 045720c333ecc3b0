"""How to start each peer and how to talk to it (a JSON POST sender per client thread).

``fastapi`` runs in the project's venv; ``infinity`` / ``infinity-onnx`` (torch and ONNX
Runtime engines) in ``.build/venv-infinity``, installed on first use, skipped with the
reason when it cannot be installed or started offline.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from client.load.loadgen import JsonPostSender, SenderFactory

from .process import PeerProcess

INFINITY_VERSION = "0.0.78"
TORCH_PIN = "torch==2.14.1"
# infinity 0.0.78's optimum engine calls optimum 1.x APIs (2.x fails its optimisation
# and its file lookup); the rest pins what optimum 1.24 and infinity (numpy < 2) accept.
INFINITY_EXTRAS = ("optimum[onnxruntime]==1.24.0", "numpy<2", "pyarrow<20", "datasets<3.4")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class Peer:
    """A started peer, its client factory and its version string."""

    name: str
    process: PeerProcess
    factory: SenderFactory
    version: str


def _uvicorn(app: str, port: int) -> list[str]:
    # Clients wait at a barrier until every client has warmed up; uvicorn's default
    # 5 s keep-alive would close their idle connections meanwhile.
    return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "600"]


def _started(
    name: str, command: list[str], port: int, log_dir: Path, env: dict, cwd: Path | None,
    timeout_s: float,
) -> PeerProcess:
    """A peer's process started (log ``<log_dir>/<name>.log``) and answering ``/health``."""
    process = PeerProcess(name, command, port, "/health", log_dir / f"{name}.log", env, cwd)
    process.start()
    process.wait_ready(timeout_s=timeout_s)
    return process


def _json_senders(port: int, path: str, body, count) -> SenderFactory:
    """A factory of JSON POST senders to ``path`` (``body(texts)``, ``count(reply)``)."""
    return lambda: JsonPostSender("127.0.0.1", port, path, body, count)


def _fastapi_versions() -> str:
    import fastapi
    import sentence_transformers
    import uvicorn

    return (
        f"fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}"
    )


def fastapi_peer(root: Path, model_path: str, port: int, log_dir: Path, device: str,
                 kind: str = "embed") -> Peer:
    """Start the FastAPI + sentence-transformers peer (``kind`` rerank: its factory is unused)."""
    env = {**OFFLINE_ENV, "BENCH_PEER": kind, "BENCH_MODEL_PATH": model_path,
           "BENCH_DEVICE": "cuda" if device == "gpu" else "cpu"}
    name = "fastapi" if kind == "embed" else "fastapi-ce"
    command = _uvicorn("bench.peers.fastapi_peer:app", port)
    process = _started(name, command, port, log_dir, env, root, timeout_s=180)
    factory = _json_senders(
        port, "/embed", lambda texts: {"texts": texts}, lambda reply: len(reply["embeddings"])
    ) if kind == "embed" else (lambda: None)
    return Peer(name, process, factory, _fastapi_versions())


def _run(cmd: list[str], log, timeout_s: float) -> None:
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=timeout_s)


def ensure_infinity(venv: Path, log_path: Path, install: bool = True) -> tuple[Path | None, str]:
    """``(infinity_emb executable, version)`` or ``(None, why not)``; installs if allowed."""
    exe = venv / "bin" / "infinity_emb"
    optimum = next((venv / "lib").glob("python*/site-packages/optimum/onnxruntime"), None)
    if not exe.is_file() or optimum is None:
        if not install:
            return None, f"not installed in {venv} (installation skipped)"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        pip = str(venv / "bin" / "pip")
        spec = f"infinity-emb[torch,server]=={INFINITY_VERSION}"
        try:
            with log_path.open("ab") as log:
                _run([sys.executable, "-m", "venv", str(venv)], log, 120)
                _run([pip, "install", "-q", TORCH_PIN], log, 900)
                _run([pip, "install", "-q", spec, *INFINITY_EXTRAS, TORCH_PIN], log, 900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            return None, f"pip install {spec} failed ({exc}); see {log_path}"
    try:
        script = "import importlib.metadata as m; print(m.version('infinity-emb'))"
        version = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return None, f"infinity-emb in {venv} is broken: {exc}"
    return exe, version


def infinity_peer(
    exe: Path,
    version: str,
    model_path: str,
    port: int,
    log_dir: Path,
    device: str,
    engine: str = "torch",
) -> Peer:
    """Start ``infinity_emb v2`` on the local model folder, offline.

    ``engine="optimum"``: ``model_path`` is a folder of :mod:`bench.peers.infinity_onnx`, and
    the process starts inside it (infinity finds ``model.onnx`` by a relative path).
    """
    served = "all-MiniLM-L6-v2"
    name = "infinity" if engine == "torch" else "infinity-onnx"
    command = [str(exe), "v2", "--model-id", model_path if engine == "torch" else ".",
               "--served-model-name", served, "--engine", engine,
               "--device", "cuda" if device == "gpu" else "cpu", "--batch-size", "32",
               "--host", "127.0.0.1", "--port", str(port), "--no-vector-disk-cache",
               "--log-level", "warning"]  # fmt: skip
    cwd = None if engine == "torch" else Path(model_path)
    process = _started(name, command, port, log_dir, OFFLINE_ENV, cwd, timeout_s=300)
    factory = _json_senders(
        port, "/embeddings", lambda t: {"model": served, "input": t}, lambda r: len(r["data"])
    )
    label = "torch engine" if engine == "torch" else "ONNX Runtime engine via optimum"
    return Peer(name, process, factory, f"infinity-emb {version} ({label})")
