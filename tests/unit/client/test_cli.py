"""The thin client's CLI loads load generation (client.load) only for bench and perf-data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Runs the CLI in a fresh interpreter, then prints the client modules it imported.
PROBE = """
import json, sys
from client.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("client"))))
"""


def _client_modules(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_does_not_import_load_generation() -> None:
    modules = _client_modules("--help")
    assert "client.cli" in modules
    assert not [m for m in modules if m.startswith("client.load")], modules


def test_embed_does_not_import_load_generation() -> None:
    # No server listens on port 9: the command fails to connect, after its imports ran.
    modules = _client_modules(
        "embed", "--url", "127.0.0.1:9", "--timeout", "1", "--model", "m", "a text"
    )
    assert "client.api" in modules
    assert not [m for m in modules if m.startswith("client.load")], modules


def test_perf_data_imports_load_generation(tmp_path) -> None:
    modules = _client_modules("perf-data", "--out", str(tmp_path), "--texts", "2")
    assert "client.load.perf_data" in modules
    assert (tmp_path / "text.json").is_file()
