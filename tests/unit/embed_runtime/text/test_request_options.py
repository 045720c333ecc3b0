"""Per-request ``prompt_name`` and ``dimensions``: parsing, prompting, truncation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embed_runtime.errors import InvalidInputError
from embed_runtime.text.request_options import (
    apply_prompt,
    parse_prompts,
    request_parameters,
    resolve_dimensions,
    resolve_prompt,
    truncate,
)
from embed_runtime.text.tokenizer import TokenizerParams, prompted_texts

PROMPTS = {"query": "query: ", "passage": "passage: ", "plain": ""}


def test_request_parameters_reads_triton_json_and_empty():
    assert request_parameters('{"dimensions":64,"prompt_name":"query"}') == {
        "dimensions": 64,
        "prompt_name": "query",
    }
    assert request_parameters("") == {}
    assert request_parameters(None) == {}
    with pytest.raises(InvalidInputError):
        request_parameters("[1, 2]")


def test_prompt_by_name_default_and_none():
    assert resolve_prompt({"prompt_name": "passage"}, PROMPTS, "query") == "passage: "
    assert resolve_prompt({}, PROMPTS, "query") == "query: "
    assert resolve_prompt({}, PROMPTS, "") == ""
    assert resolve_prompt({"prompt_name": "plain"}, PROMPTS, "query") == ""


@pytest.mark.parametrize("name", ["nope", 3, ["query"]])
def test_unknown_or_non_string_prompt_name_is_invalid(name):
    with pytest.raises(InvalidInputError, match="prompt_name"):
        resolve_prompt({"prompt_name": name}, PROMPTS, "")


def test_apply_prompt_prepends_like_sentence_transformers():
    assert apply_prompt("query: ", ["a", "b"]) == ["query: a", "query: b"]
    assert apply_prompt("", ["a"]) == ["a"]


def test_parse_prompts_refuses_non_strings():
    assert parse_prompts('{"q": "q: "}') == {"q": "q: "}
    assert parse_prompts("") == {}
    with pytest.raises(ValueError):
        parse_prompts('{"q": 1}')


@pytest.mark.parametrize("value", [0, 385, -1, 3.5, "abc", "64", True, False, [64]])
def test_bad_dimensions_are_invalid(value):
    with pytest.raises(InvalidInputError, match="dimensions"):
        resolve_dimensions({"dimensions": value}, 384)


def test_dimensions_default_and_range():
    assert resolve_dimensions({}, 384) == 384
    assert resolve_dimensions({}, 384, 128) == 128
    assert resolve_dimensions({"dimensions": 1}, 384, 128) == 1
    assert resolve_dimensions({"dimensions": 384}, 384) == 384


def test_dimensions_refused_where_the_model_cannot_truncate():
    assert resolve_dimensions({}, 0) == 0
    with pytest.raises(InvalidInputError, match="does not support dimensions"):
        resolve_dimensions({"dimensions": 8}, 0)


@pytest.mark.parametrize("normalize", [True, False])
def test_truncate_matches_sentence_transformers(normalize):
    """sentence-transformers truncates the pipeline output, then normalises if asked."""
    from sentence_transformers.util import truncate_embeddings

    rng = np.random.default_rng(0)
    raw = rng.normal(size=(5, 32)).astype(np.float32)
    full = raw / np.linalg.norm(raw, axis=1, keepdims=True) if normalize else raw
    for k in (1, 8, 31, 32):
        want = truncate_embeddings(torch.from_numpy(raw), k)
        if normalize:
            want = torch.nn.functional.normalize(want, p=2, dim=1)
        got = truncate(full.astype(np.float32), k, normalize)
        assert got.shape == (5, k) and got.dtype == np.float32
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6)


def test_prompted_texts_checks_dimensions_and_applies_default():
    params = TokenizerParams(
        16, False, ("input_ids",), prompts=tuple(PROMPTS.items()), default_prompt_name="query"
    )
    assert prompted_texts(["x"], {}, params) == ["query: x"]
    assert prompted_texts(["x"], {"prompt_name": "passage"}, params) == ["passage: x"]
    with pytest.raises(InvalidInputError, match="does not support dimensions"):
        prompted_texts(["x"], {"dimensions": 4}, params)
    wide = TokenizerParams(16, False, ("input_ids",), max_dimensions=8)
    assert prompted_texts(["x"], {"dimensions": 4}, wide) == ["x"]
    with pytest.raises(InvalidInputError, match="unknown prompt_name"):
        prompted_texts(["x"], {"prompt_name": "query"}, wide)


def test_tokenizer_params_read_prompt_parameters():
    base = {
        "max_length": "8",
        "pad_to_max_length": "false",
        "output_names": "input_ids",
        "max_text_bytes": "100",
        "max_request_text_bytes": "1000",
    }
    plain = TokenizerParams.from_parameters(base)
    assert plain.prompts == () and plain.max_dimensions == 0
    params = TokenizerParams.from_parameters(
        {
            **base,
            "prompts": '{"query": "query: "}',
            "default_prompt_name": "query",
            "max_dimensions": "384",
        }
    )
    assert params.prompts == (("query", "query: "),)
    assert params.default_prompt_name == "query" and params.max_dimensions == 384


def _entry(**extra) -> dict:
    return {"name": "m", "family": "sentence-transformers", "source": "x", **extra}


def test_manifest_takes_prompts_default_and_truncate_dim(tmp_path):
    from generator.manifest import parse_manifest

    entry = parse_manifest(
        {
            "models": [
                _entry(prompts={"query": "q: "}, default_prompt_name="query", truncate_dim=64)
            ]
        },
        tmp_path,
    ).models[0]
    assert entry.prompts == {"query": "q: "} and entry.truncate_dim == 64


@pytest.mark.parametrize(
    "extra",
    [
        {"prompts": {"q": 1}},
        {"prompts": "q: "},
        {"truncate_dim": 0},
        {"truncate_dim": True},
        {"truncate_dim": 8, "encoder_backend": "onnxruntime"},
    ],
)
def test_manifest_refuses_bad_prompt_options(tmp_path, extra):
    from generator.manifest import ManifestError, parse_manifest

    with pytest.raises(ManifestError):
        parse_manifest({"models": [_entry(**extra)]}, tmp_path)


def test_runtime_manifest_round_trips_prompts(tmp_path):
    from generator.manifest import load_manifest
    from generator.manifest_edit import append_entry

    path = tmp_path / "runtime-models.toml"
    path.write_text("", encoding="utf-8")
    append_entry(path, _entry(prompts={"query": 'q "1": '}, truncate_dim=32))
    entry = load_manifest(path).models[0]
    assert entry.prompts == {"query": 'q "1": '} and entry.truncate_dim == 32


def test_cli_passes_prompt_name_and_dimensions():
    from client.cli import parse_args

    args = parse_args(
        ["embed", "--model", "m", "--prompt-name", "query", "--dimensions", "128", "x"]
    )
    assert (args.prompt_name, args.dimensions, args.texts) == ("query", 128, ["x"])
    with pytest.raises(SystemExit):
        parse_args(["embed", "--model", "m", "--dimensions", "8", "--image", "a.png"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embed_texts_sends_options_as_request_parameters(monkeypatch, protocol):
    import inspect

    from client import DEADLINE_PARAMETER, EmbeddingClient

    sent = []

    class Result:
        def as_numpy(self, _name):
            return np.zeros((1, 4), dtype=np.float32)

    signature = inspect.signature(EmbeddingClient.embed_texts).parameters
    assert signature["prompt_name"].kind is inspect.Parameter.KEYWORD_ONLY
    assert signature["dimensions"].kind is inspect.Parameter.KEYWORD_ONLY
    with EmbeddingClient("127.0.0.1:1", protocol) as client:
        monkeypatch.setattr(client, "_max_batch_size", lambda _m: 8)
        monkeypatch.setattr(
            client._client, "infer", lambda *a, **kw: sent.append(kw.get("parameters")) or Result()
        )
        client.embed_texts("m", ["x"], prompt_name="query", dimensions=4)
        client.embed_texts("m", ["x"])
    # every request also carries the call's deadline (client.deadline)
    deadlines = [parameters.pop(DEADLINE_PARAMETER) for parameters in sent]
    assert all(isinstance(d, int) and d > 0 for d in deadlines)
    assert sent == [{"prompt_name": "query", "dimensions": 4}, {}]
