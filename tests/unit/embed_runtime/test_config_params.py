"""Settings that write and read their own config parameters (``ConfigParams``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import ClassVar

import pytest

from embed_runtime.config_params import ConfigParams, json_text, param
from embed_runtime.text.tokenizer import TokenizerParams


@dataclass(frozen=True)
class Knobs(ConfigParams):
    params_name: ClassVar[str] = "knob"

    name: str
    widths: tuple[str, ...]
    ratio: float = param(0.5, always=True)
    limit: int = param(8, required=True, key="the_limit")
    cap: int = 0
    cap_default: int = param(0, with_field="cap")
    flag: bool = True
    table: tuple[tuple[str, str], ...] = param(
        (), encode=json_text, decode=lambda text: tuple(sorted(json.loads(text).items()))
    )


def test_defaults_are_left_out_unless_always_required_or_with_a_written_field() -> None:
    knobs = Knobs("m", ("a", "b"))
    assert knobs.to_parameters() == {
        "name": "m", "widths": "a,b", "ratio": "0.5", "the_limit": "8",
    }
    capped = replace(knobs, cap=4, flag=False, table=(("q", "x"),))
    assert capped.to_parameters() == {
        "name": "m", "widths": "a,b", "ratio": "0.5", "the_limit": "8", "cap": "4",
        "cap_default": "0", "flag": "false", "table": '{"q": "x"}',
    }


@pytest.mark.parametrize("knobs", [
    Knobs("m", ("a",)),
    Knobs("m", ("a", "b"), ratio=0.25, limit=3, cap=2, cap_default=1, flag=False,
          table=(("a", "1"), ("b", "2"))),
])
def test_what_is_written_reads_back_to_the_same_settings(knobs) -> None:
    assert Knobs.from_parameters(knobs.to_parameters()) == knobs


@pytest.mark.parametrize("key", ["name", "widths", "the_limit"])
def test_a_missing_required_parameter_is_named(key) -> None:
    raw = Knobs("m", ("a",)).to_parameters()
    del raw[key]
    with pytest.raises(ValueError, match=f"knob config parameter '{key}' is missing"):
        Knobs.from_parameters(raw)


def test_tokenizer_params_round_trip_with_prompts_and_caps() -> None:
    params = TokenizerParams(
        128, False, ("input_ids", "attention_mask"), pad_id=3, lowercase=True,
        max_text_bytes=100, max_request_bytes=1000, prompts=(("query", "q: "),),
        default_prompt_name="query", max_dimensions=64, add_special_tokens=False,
    )
    raw = params.to_parameters()
    assert raw["max_request_text_bytes"] == "1000" and raw["prompts"] == '{"query": "q: "}'
    assert TokenizerParams.from_parameters(raw) == params


@pytest.mark.parametrize("fields", [
    {},
    {"shared_intra_op_threads": -1, "spin_duration_us": 50, "weight_cache": False},
    {"max_dimensions": 384, "normalize": True},
    {"sparse": True},
    {"sparse": True, "max_active_dims": 64, "max_padding_share": 0.25},
])
def test_encoder_params_round_trip(fields) -> None:
    from embed_runtime.engines.ort_encoder import AUTO_THREADS, EncoderParams

    params = EncoderParams("model.onnx", ("input_ids", "attention_mask"), "EMBEDDING", True, 8,
                           **fields)
    raw = params.to_parameters()
    assert EncoderParams.from_parameters(raw) == params
    if params.shared_intra_op_threads == AUTO_THREADS:
        assert raw["shared_intra_op_threads"] == "auto"
    if params.max_dimensions:  # the default width and normalize go with it
        assert raw["default_dimensions"] == "0" and raw["normalize"] == "true"
    assert ("max_active_dims" in raw) == params.sparse


def test_partial_parameters_write_only_the_named_fields_and_read_back() -> None:
    from embed_runtime.engines.ort_encoder import EncoderParams

    sparse = EncoderParams.partial_parameters(sparse=True, max_active_dims=0)
    assert sparse == {"sparse": "true", "max_active_dims": "0"}
    assert EncoderParams.partial_parameters(fused_tokenize=True) == {"fused_tokenize": "true"}
    base = EncoderParams("model.onnx", ("input_ids",), "EMBEDDING", False, 8)
    fused = EncoderParams.partial_parameters(fused_tokenize=True)
    raw = {**base.to_parameters(), **sparse, **fused}
    read = EncoderParams.from_parameters(raw)
    assert (read.sparse, read.max_active_dims, read.fused_tokenize) == (True, 0, True)
    with pytest.raises(ValueError, match=r"EncoderParams has no fields \['spares'\]"):
        EncoderParams.partial_parameters(spares=True)


def test_float32_only_is_a_tokenizer_parameter_written_only_when_set() -> None:
    params = TokenizerParams(128, False, ("input_ids", "attention_mask"))
    assert "float32_only" not in params.to_parameters()
    only = replace(params, float32_only=True)
    assert only.to_parameters()["float32_only"] == "true"
    assert TokenizerParams.from_parameters(only.to_parameters()).float32_only


def test_query_route_parameters_are_the_ones_the_router_reads() -> None:
    from embed_runtime.engines.sparse_router import QueryRouteParams

    route = QueryRouteParams(max_length=512, pad_id=1, lowercase=True)
    assert route.to_parameters() == {
        "query_tokenizer_file": "query_tokenizer.json",
        "query_weights_file": "query_weights.npy",
        "query_max_length": "512",
        "query_pad_id": "1",
        "query_lowercase": "true",
    }
    assert QueryRouteParams.from_parameters(route.to_parameters()) == route
    with pytest.raises(ValueError, match="query route config parameter 'query_max_length'"):
        QueryRouteParams.from_parameters({"query_tokenizer_file": "t.json"})


def test_watch_params_write_the_probe_interval_and_default_to_the_probe_s() -> None:
    from embed_runtime.ops.probe import PROBE_INTERVAL_S
    from embed_runtime.ops.stub_watch import WatchParams

    assert WatchParams().to_parameters() == {"health_probe_interval_s": "10"}
    assert WatchParams(2.5).to_parameters() == {"health_probe_interval_s": "2.5"}
    assert WatchParams.from_parameters({}) == WatchParams(PROBE_INTERVAL_S, 1.0)
    off = {"stub_watch_interval_s": "0", "health_probe_interval_s": "0"}
    read = WatchParams.from_parameters(off)
    assert (read.stub_watch_interval_s, read.health_probe_interval_s) == (0.0, 0.0)
