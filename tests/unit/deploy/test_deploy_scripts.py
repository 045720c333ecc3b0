"""The deploy scripts: shellcheck and ruff on them, deploy/healthcheck.py against local servers."""

from __future__ import annotations

import importlib.util
import subprocess
import urllib.request

import pytest

from tests.http_servers import LocalServer, QuietHandler
from tests.unit.deploy.deploy_files import BIN, DEPLOY, ROOT


@pytest.mark.parametrize(
    "script",
    ["perf/run_perf.sh", "entrypoint.sh", "docker/make_base_image.sh", "docker/test_docker.sh"],
)
def test_shell_scripts_pass_shellcheck_and_are_executable(script) -> None:
    path = DEPLOY / script
    assert path.stat().st_mode & 0o111
    done = subprocess.run([str(BIN / "shellcheck"), str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_deploy_python_passes_ruff() -> None:
    done = subprocess.run(
        [str(BIN / "ruff"), "check", str(DEPLOY)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def healthcheck():
    spec = importlib.util.spec_from_file_location("deploy_healthcheck", DEPLOY / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_fails_when_nothing_listens(healthcheck, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_HTTP_PORT", "9")
    assert healthcheck.main() == 1


class _Recorder(QuietHandler):
    """Answers every GET with 200 and records the request line's target."""

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        self.reply(200, ctype=None)


def _recording_server() -> LocalServer:
    return LocalServer(_Recorder)


def test_healthcheck_ignores_proxy_variables(healthcheck, monkeypatch) -> None:
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with _recording_server() as proxy:
        proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy_url)
        monkeypatch.setenv("TRITON_HOST", "0.0.0.0")
        with _recording_server() as triton:
            port = triton.server_address[1]
            ready_url = f"http://127.0.0.1:{port}/v2/health/ready"
            # A plain urllib client with these variables sends even loopback to the proxy.
            with urllib.request.build_opener().open(ready_url, timeout=5) as resp:
                assert resp.status == 200
            assert proxy.seen == [ready_url] and triton.seen == []
            monkeypatch.setenv("TRITON_HTTP_PORT", str(port))
            assert healthcheck.main() == 0
            assert triton.seen == ["/v2/health/ready"]
        # The server is gone; the proxy would still answer 200, but it is never asked.
        assert healthcheck.main() == 1
        assert proxy.seen == [ready_url]


def test_healthcheck_probes_the_address_triton_listens_on(healthcheck) -> None:
    assert healthcheck.probe_host("") == "127.0.0.1"
    assert healthcheck.probe_host("0.0.0.0") == "127.0.0.1"
    assert healthcheck.probe_host("::") == "::1"
    assert healthcheck.probe_host("10.1.2.3") == "10.1.2.3"
    with _recording_server() as triton:
        assert healthcheck.ready(triton.server_address[1], "127.0.0.1")
