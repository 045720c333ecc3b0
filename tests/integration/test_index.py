"""``python -m client index`` against the session's real Triton (issue 47).

The command runs as a user runs it (a subprocess); its Parquet shards are read back with
pandas and compared with direct ``EmbeddingClient`` calls. The resume test kills the
indexer for real (SIGKILL, once its first shard file exists) and compares the resumed
output with an uninterrupted run. Images come from a real local HTTP server.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from client.load.corpus import varied_sentences
from tests.http_servers import ImageServer
from tests.integration.clip_fixture import CLIP_MODEL, decompression_bomb, sample_images
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ROWS = 400
SHARD = 40


def _command(server, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "client",
        "index",
        "--url",
        server.http_url,
        "--admin-key",
        ADMIN_KEY,
        *args,
    ]


def _run(server, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(server, *args),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _read(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "embeddings").sort_values("id").reset_index(drop=True)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> tuple[Path, list[str]]:
    """A JSONL corpus: ids, distinct texts and a column to keep."""
    folder = tmp_path_factory.mktemp("index-corpus")
    # distinct texts, case aside (the model is uncased): no two rows tie in a search
    seen: dict[str, str] = {}
    for text in varied_sentences(3 * ROWS, seed=47):
        seen.setdefault(text.lower(), text)
    texts = list(seen.values())[:ROWS]
    path = folder / "docs.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i, text in enumerate(texts):
            handle.write(json.dumps({"id": f"doc-{i:04d}", "text": text, "lang": "en"}) + "\n")
    return path, texts


@pytest.fixture(scope="module")
def full_run(server, corpus_file, tmp_path_factory) -> Path:
    """One uninterrupted run over the corpus."""
    out = tmp_path_factory.mktemp("index-full") / "out"
    path, _ = corpus_file
    done = _run(
        server, "--model", TEXT_MODEL, str(path), "--out", str(out),
        "--shard-rows", str(SHARD), "--keep-columns", "lang",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def test_index_writes_each_row_once_with_the_clients_vectors(server, corpus_file, full_run):
    path, texts = corpus_file
    frame = _read(full_run)
    assert list(frame["id"]) == [f"doc-{i:04d}" for i in range(ROWS)]
    assert set(frame["lang"]) == {"en"}
    with server.client() as client:
        want = client.embed_texts(TEXT_MODEL, texts)
    np.testing.assert_allclose(np.stack(frame["embedding"]), want, atol=1e-5)
    shards = sorted(p.name for p in (full_run / "embeddings").iterdir())
    assert shards == [f"part-{k:05d}.parquet" for k in range(ROWS // SHARD)]
    manifest = json.loads((full_run / "manifest.json").read_text())
    assert manifest["model"] == TEXT_MODEL and manifest["kind"] == "dense"
    assert manifest["config_digest"].startswith("config:")
    assert len(manifest["shards"]) == ROWS // SHARD
    assert sum(s["rows"] for s in manifest["shards"].values()) == ROWS


def test_index_killed_by_sigkill_resumes_to_the_uninterrupted_output(
    server, corpus_file, full_run, tmp_path
):
    path, _ = corpus_file
    out = tmp_path / "out"
    args = ["--model", TEXT_MODEL, str(path), "--out", str(out), "--shard-rows", str(SHARD)]
    args += ["--keep-columns", "lang", "--concurrency", "2"]
    process = subprocess.Popen(
        _command(server, *args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    first = out / "embeddings" / "part-00000.parquet"
    end = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    before = {p.name: p.stat().st_mtime_ns for p in (out / "embeddings").glob("*.parquet")}
    assert 0 < len(before) < ROWS // SHARD

    resumed = _run(server, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(before) * SHARD} rows already done" in resumed.stderr
    for name, mtime in before.items():  # finished shards are not written again
        assert (out / "embeddings" / name).stat().st_mtime_ns == mtime
    got, want = _read(out), _read(full_run)
    assert list(got["id"]) == list(want["id"])
    np.testing.assert_allclose(np.stack(got["embedding"]), np.stack(want["embedding"]), atol=1e-5)
    assert not list((out / "embeddings").glob(".*"))  # no temporary file left


def test_index_killed_between_shard_and_manifest_resumes(server, corpus_file, full_run, tmp_path):
    path, _ = corpus_file
    out = tmp_path / "out"
    args = ["--model", TEXT_MODEL, str(path), "--out", str(out), "--shard-rows", str(SHARD)]
    args += ["--keep-columns", "lang"]
    killed = _run(server, *args, env={"EMBED_INDEX_KILL_AFTER_SHARDS": "3"})
    assert killed.returncode == -signal.SIGKILL
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) == 2  # the third shard's file exists, unrecorded
    resumed = _run(server, *args)
    assert resumed.returncode == 0, resumed.stderr
    got, want = _read(out), _read(full_run)
    assert list(got["id"]) == list(want["id"])
    np.testing.assert_allclose(np.stack(got["embedding"]), np.stack(want["embedding"]), atol=1e-5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(s["rows"] for s in manifest["shards"].values()) == ROWS


def test_index_refuses_changed_options_and_restarts_on_request(server, corpus_file, tmp_path):
    path, texts = corpus_file
    out = tmp_path / "out"
    base = ["--model", TEXT_MODEL, str(path), "--out", str(out), "--shard-rows", "200"]
    assert _run(server, *base).returncode == 0
    changed = _run(server, *base, "--dimensions", "128")
    assert changed.returncode == 2
    assert 'options: {} -> {"dimensions": 128}' in changed.stderr
    restarted = _run(server, *base, "--dimensions", "128", "--restart")
    assert restarted.returncode == 0, restarted.stderr
    frame = _read(out)
    assert len(frame) == ROWS and len(frame["embedding"][0]) == 128
    with server.client() as client:
        want = client.embed_texts(TEXT_MODEL, texts[:5], dimensions=128)
    got = np.stack(frame.set_index("id").loc[[f"doc-{i:04d}" for i in range(5)], "embedding"])
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_index_records_bad_text_rows_and_embeds_the_rest(server, tmp_path):
    long_text = "word " * 600
    rows = [
        {"id": "a", "text": "a good sentence"},
        {"id": "b", "text": ""},
        {"id": "c", "text": long_text},
        {"id": "d", "text": 17},
        {"id": "e"},
        {"id": "f", "text": "another good sentence"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n", encoding="utf-8")
    out = tmp_path / "out"
    done = _run(server, "--model", TEXT_MODEL, str(path), "--out", str(out), "--no-truncate")
    assert done.returncode == 1
    assert "5 rows failed" in done.stderr
    assert list(_read(out)["id"]) == ["a", "f"]
    errors = pd.read_parquet(out / "errors").set_index("id")["reason"]
    assert errors["b"] == "empty text"
    assert "longer than" in errors["c"] or "token" in errors["c"], errors["c"]
    assert "not text" in errors["d"] and "no value" in errors["e"]
    assert "not JSON" in errors["6"]


def test_index_refuses_unknown_model_and_wrong_kind_at_once(server, corpus_file, tmp_path):
    path, _ = corpus_file
    unknown = _run(server, "--model", "no-such-model", str(path), "--out", str(tmp_path / "a"))
    assert unknown.returncode == 2 and "unknown model 'no-such-model'" in unknown.stderr
    wrong = _run(server, "--model", f"{CLIP_MODEL}_image", str(path), "--out", str(tmp_path / "b"))
    assert wrong.returncode == 2 and "not TEXT" in wrong.stderr
    (tmp_path / "one.png").write_bytes(sample_images()["photo.png"])
    images = _run(server, "--model", TEXT_MODEL, "--images", str(tmp_path), "--out", str(tmp_path))
    assert images.returncode == 2 and "takes no images" in images.stderr


def test_index_images_from_a_folder_and_urls_with_bad_ones_recorded(server, tmp_path):
    images = sample_images()
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    good = ["photo.jpg", "photo.png", "tall.png", "rgba.png", "cmyk.jpg"]
    for name in good:
        (folder / "nested" / name).write_bytes(images[name])
    (folder / "truncated.jpg").write_bytes(images["photo.jpg"][:600])
    (folder / "text.png").write_bytes(b"not an image at all")
    (folder / "bomb.png").write_bytes(decompression_bomb())
    out = tmp_path / "out"
    done = _run(server, "--model", CLIP_MODEL, "--images", str(folder), "--out", str(out))
    assert done.returncode == 1, done.stderr
    frame = _read(out)
    assert list(frame["id"]) == sorted(f"nested/{n}" for n in good)
    with server.client() as client:
        want = client.embed_images(CLIP_MODEL, [images[n] for n in sorted(good)])
    np.testing.assert_allclose(np.stack(frame["embedding"]), want, atol=1e-5)
    errors = pd.read_parquet(out / "errors").set_index("id")["reason"]
    assert sorted(errors.index) == ["bomb.png", "text.png", "truncated.jpg"]

    tar_path = tmp_path / "shard-000.tar"  # the same images as a webdataset tar
    with tarfile.open(tar_path, "w") as tar:
        for key, name in enumerate([*sorted(good), "truncated.jpg"]):
            data = (folder / "nested" / name if name in good else folder / name).read_bytes()
            info = tarfile.TarInfo(f"{key:03d}.{name.rpartition('.')[2]}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "tar"
    done = _run(server, "--model", CLIP_MODEL, "--images", str(tar_path), "--out", str(out))
    assert done.returncode == 1, done.stderr
    np.testing.assert_allclose(np.stack(_read(out)["embedding"]), want, atol=1e-5)
    errors = pd.read_parquet(out / "errors")
    assert list(errors["id"]) == ["005"] and list(errors["input"]) == ["shard-000.tar:005.jpg"]

    with ImageServer(images) as site:
        table = pd.DataFrame(
            {
                "id": ["u1", "u2", "u3", "u4", "p1"],
                "url": [
                    site.url("/img/photo.jpg"),
                    site.url("/img/missing.jpg"),
                    site.url("/to-metadata"),
                    site.url("/html"),
                    "nested/photo.png",
                ],
                "caption": ["a", "b", "c", "d", "e"],
            }
        )
        table.to_parquet(folder / "urls.parquet")
        out = tmp_path / "urls"
        done = _run(
            server, "--model", CLIP_MODEL, "--image-column", "url", str(folder / "urls.parquet"),
            "--out", str(out), "--keep-columns", "caption",
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    frame = _read(out)
    assert list(frame["id"]) == ["p1", "u1"] and list(frame["caption"]) == ["e", "a"]
    want = [images["photo.png"], images["photo.jpg"]]
    with server.client() as client:
        np.testing.assert_allclose(
            np.stack(frame["embedding"]), client.embed_images(CLIP_MODEL, want), atol=1e-5
        )
    errors = pd.read_parquet(out / "errors").set_index("id")["reason"]
    assert sorted(errors.index) == ["u2", "u3", "u4"]
    assert "404" in errors["u2"]


def test_index_into_qdrant_matches_exact_search_and_reruns_idempotently(
    server, corpus_file, tmp_path
):
    from qdrant_client import QdrantClient

    path, texts = corpus_file
    out, store = tmp_path / "out", tmp_path / "qdrant"
    args = ["--model", TEXT_MODEL, str(path), "--out", str(out), "--shard-rows", "100"]
    args += ["--keep-columns", "lang", "--qdrant", str(store), "--collection", "docs"]
    assert _run(server, *args).returncode == 0
    again = _run(server, *args, "--restart")
    assert again.returncode == 0, again.stderr
    frame = _read(out)
    vectors = np.stack(frame["embedding"])
    ids = list(frame["id"])
    with server.client() as client:
        queries = client.embed_texts(TEXT_MODEL, texts[:8] + ["a question about the weather"])
    qdrant = QdrantClient(path=str(store))
    try:
        assert qdrant.count("docs").count == ROWS
        for query in queries:
            exact = [ids[i] for i in np.argsort(-(vectors @ query))[:10]]
            points = qdrant.query_points("docs", query=query.tolist(), limit=10).points
            got = [p.payload["id"] for p in points]
            assert len(set(got) & set(exact)) / 10 == 1.0
            assert {p.payload["lang"] for p in points} == {"en"}
    finally:
        qdrant.close()


def test_index_of_chunks_resumes_after_sigkill_with_each_chunk_once(server, tmp_path):
    """Documents past the window, one row (and one Qdrant point) per chunk, killed and resumed."""
    from qdrant_client import QdrantClient

    sentences = varied_sentences(900, seed=11)
    documents = [" ".join(sentences[i * 30 : i * 30 + 6 + 24 * (i % 2)]) for i in range(24)]
    path = tmp_path / "long.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"d{i:02d}", "text": t}) + "\n" for i, t in enumerate(documents)),
        encoding="utf-8",
    )
    out, store = tmp_path / "out", tmp_path / "qdrant"
    args = ["--model", TEXT_MODEL, str(path), "--out", str(out), "--shard-rows", "4"]
    args += ["--chunk-tokens", "96", "--chunk-overlap", "16", "--qdrant", str(store)]
    killed = _run(server, *args, env={"EMBED_INDEX_KILL_AFTER_SHARDS": "2"})
    assert killed.returncode == -signal.SIGKILL
    resumed = _run(server, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "8 rows already done" in resumed.stderr
    frame = pd.read_parquet(out / "embeddings").sort_values(["id", "chunk"])
    with server.client() as client:
        want = client.embed_chunks(TEXT_MODEL, documents, chunk_tokens=96, chunk_overlap=16)
    assert len(frame) == len(want) > 2 * len(documents)  # every chunk once
    for (_, row), chunk in zip(frame.iterrows(), want, strict=True):
        assert row["id"] == f"d{chunk.row:02d}"
        assert (row["start"], row["end"], row["tokens"]) == (chunk.start, chunk.end, chunk.tokens)
        np.testing.assert_allclose(row["embedding"], chunk.vector, atol=1e-5)
    counts = frame.groupby("id")["chunk"].count()
    assert (frame.groupby("id")["chunks"].first() == counts).all()
    qdrant = QdrantClient(path=str(store))
    try:
        assert qdrant.count(TEXT_MODEL).count == len(want)
        query = want[5].vector.tolist()
        (best,) = qdrant.query_points(TEXT_MODEL, query=query, limit=1).points
        assert best.payload == {"id": f"d{want[5].row:02d}", "chunk": int(frame.iloc[5]["chunk"]),
                                "start": want[5].start, "end": want[5].end}
    finally:
        qdrant.close()
    changed = _run(server, *args[:-4], "--chunk-tokens", "64")
    assert changed.returncode == 2
    assert '"chunk_tokens": 96' in changed.stderr and '"chunk_tokens": 64' in changed.stderr
