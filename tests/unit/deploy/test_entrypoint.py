"""The entrypoint's external-Triton switches, and the deployment docs naming every command."""

from __future__ import annotations

import pytest

from generator.triton_local import prepare_backends, server_env, triton_binary
from tests.unit.deploy.deploy_files import DOCS

# --- the entrypoint's external-Triton switches --------------------------------------------


def test_serve_uses_triton_server_bin_and_backend_dir_from_the_environment(
    tmp_path, monkeypatch
) -> None:
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text("")
    (tmp_path / "backends" / "python").mkdir(parents=True)
    monkeypatch.setenv("TRITON_SERVER_BIN", str(binary))
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(tmp_path / "backends"))
    assert triton_binary() == binary
    assert prepare_backends(tmp_path / "unused") == tmp_path / "backends"
    assert not (tmp_path / "unused").exists()
    env = server_env({"TRITON_SERVER_BIN": str(binary), "LD_LIBRARY_PATH": "/opt/tritonserver/lib"})
    assert env["LD_LIBRARY_PATH"] == "/opt/tritonserver/lib"
    monkeypatch.setenv("TRITON_BACKEND_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no python/ backend"):
        prepare_backends(tmp_path / "unused")


def test_local_triton_stays_the_default_without_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_SERVER_BIN", raising=False)
    assert triton_binary().parts[-3:] == ("tritonserver", "bin", "tritonserver")
    env = server_env({"PATH": "/usr/bin"})
    assert "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"]


def test_deployment_docs_cover_every_compose_command() -> None:
    docs = DOCS.read_text()
    for command in (
        "docker compose up",
        "docker compose --profile perf run --rm perf",
        "docker compose --profile monitoring up",
        "gpu_accelerator",
        "docker-compose.admin-key.yml",
        "docker-compose.runtime-loads.yml",
        "TRITON_PUBLISH_ADDRESS",
        "EMBED_ADMIN_KEY_SECRET_FILE",
        "GRAFANA_ADMIN_PASSWORD",
        "docs/security.md",
        "## Security defaults",
    ):
        assert command in docs, command
