"""Unit tests of the client package: payloads, routing, chunking, statistics, CLI (no server)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.json_format import MessageToJson, ParseDict
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from client import EmbeddingClient, EmbeddingClientError, ModelInfo, ModelStats
from client.cli import format_models, format_stats, main, parse_args, resolve_url
from client.payload import (
    IMAGE,
    IMAGE_URL,
    bytes_tensor,
    encode_texts,
    image_target,
    reassemble,
    route_images,
    split_batches,
)
from client.records import parse_repository_index, summarize_statistics, unwrap_model_config


def _timed(count: int, ns: int) -> dict:
    return {"count": count, "ns": ns}


def _compute(count: int, input_ns: int, infer_ns: int, output_ns: int) -> dict:
    """The compute_input / compute_infer / compute_output entries of ``count`` executions."""
    return {
        "compute_input": _timed(count, input_ns),
        "compute_infer": _timed(count, infer_ns),
        "compute_output": _timed(count, output_ns),
    }


def _model_stats(
    name: str, inferences: int, executions: int, stats: dict, batches: dict[int, dict]
) -> dict:
    """One model's entry in a statistics response: ``stats`` are its inference_stats but
    the (empty) cache counts, ``batches`` its compute entries by batch size."""
    return {
        "name": name,
        "version": "1",
        "last_inference": 1732291200000,
        "inference_count": inferences,
        "execution_count": executions,
        "inference_stats": {**stats, "cache_hit": _timed(0, 0), "cache_miss": _timed(0, 0)},
        "response_stats": {},
        "batch_stats": [{"batch_size": size, **compute} for size, compute in batches.items()],
        "memory_usage": [],
    }


# A statistics response as Triton's HTTP statistics extension returns it
# (GET v2/models/stats): one ensemble and the python-backend encoder behind it.
HTTP_STATS = {
    "model_stats": [
        _model_stats(
            "all-MiniLM-L6-v2",
            96,
            12,
            {
                "success": _timed(12, 480_000_000),
                "fail": _timed(2, 3_000_000),
                "queue": _timed(12, 24_000_000),
                **_compute(12, 1_200_000, 420_000_000, 600_000),
            },
            {8: _compute(12, 1_200_000, 420_000_000, 600_000)},
        ),
        _model_stats(
            "all-MiniLM-L6-v2_encode",
            96,
            4,
            {
                "success": _timed(12, 400_000_000),
                "fail": _timed(0, 0),
                "queue": _timed(12, 36_000_000),
                **_compute(4, 400_000, 350_000_000, 200_000),
            },
            {
                32: _compute(2, 200_000, 200_000_000, 100_000),
                16: _compute(2, 200_000, 150_000_000, 100_000),
            },
        ),
    ]
}


def _grpc_json(http_dict: dict, message) -> dict:
    """Render a dict the way tritonclient.grpc does with ``as_json=True``."""
    proto = ParseDict(http_dict, message)
    return json.loads(MessageToJson(proto, preserving_proto_field_name=True))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- payloads -----------------------------------------------------------------------


def test_text_payload_is_utf8_bytes_object_array_of_shape_n_by_1():
    texts = ["hello", "héllo wörld", "日本語のテキスト", ""]
    tensor = bytes_tensor(encode_texts(texts))
    assert tensor.dtype == np.object_
    assert tensor.shape == (4, 1)
    assert tensor[1, 0] == "héllo wörld".encode()
    roundtrip = deserialize_bytes_tensor(serialize_byte_tensor(tensor).item())
    assert [b.decode("utf-8") for b in roundtrip] == texts


def test_bytes_tensor_keeps_equal_length_items_as_objects():
    tensor = bytes_tensor([b"ab", b"cd"])
    assert tensor.dtype == np.object_ and tensor.shape == (2, 1)


def test_encode_texts_rejects_a_single_string():
    with pytest.raises(EmbeddingClientError, match="single string"):
        encode_texts("not a list")


def test_encode_texts_rejects_non_string_items():
    with pytest.raises(EmbeddingClientError, match=r"texts\[1\] is int"):
        encode_texts(["ok", 3])


# --- chunking -----------------------------------------------------------------------


def test_split_batches_respects_max_batch_size():
    slices = split_batches([1] * 10, max_items=4)
    assert [(s.start, s.stop) for s in slices] == [(0, 4), (4, 8), (8, 10)]


def test_split_batches_without_batching_limit_sends_everything_at_once():
    assert split_batches([1] * 1000, max_items=0) == [slice(0, 1000)]


def test_split_batches_respects_byte_budget_and_isolates_oversized_items():
    slices = split_batches([40, 40, 40, 500, 10], max_items=64, max_bytes=100)
    assert [(s.start, s.stop) for s in slices] == [(0, 2), (2, 3), (3, 4), (4, 5)]


def test_split_batches_of_nothing_is_empty():
    assert split_batches([], max_items=8) == []


def test_chunks_concatenate_back_to_all_rows_in_order():
    items = [f"t{i}".encode() for i in range(11)]
    chunks = [bytes_tensor(items[s]) for s in split_batches([2] * 11, max_items=3)]
    assert [c.shape[0] for c in chunks] == [3, 3, 3, 2]
    assert list(np.concatenate(chunks)[:, 0]) == items


# --- image routing ------------------------------------------------------------------


def test_mixed_images_are_routed_and_reassembled_in_input_order(tmp_path: Path):
    png = tmp_path / "a.png"
    png.write_bytes(b"\x89PNG-from-path")
    jpg = tmp_path / "b.jpg"
    jpg.write_bytes(b"\xff\xd8-from-str-path")
    images = [
        b"raw-bytes",
        "https://example.org/cat.jpg",
        png,
        "data:image/png;base64,AAAA",
        str(jpg),
        "HTTP://EXAMPLE.ORG/DOG.PNG",
    ]
    groups = {g.kind: g for g in route_images(images)}
    assert groups[IMAGE].indices == [0, 2, 4]
    assert groups[IMAGE].payloads == [b"raw-bytes", b"\x89PNG-from-path", b"\xff\xd8-from-str-path"]
    assert groups[IMAGE].input_name == "IMAGE"
    assert groups[IMAGE_URL].indices == [1, 3, 5]
    assert groups[IMAGE_URL].payloads[0] == b"https://example.org/cat.jpg"
    assert groups[IMAGE_URL].input_name == "IMAGE_URL"

    # Fake per-ensemble results whose first column is the original index.
    parts = [
        (g.indices, np.array([[i, 0.5] for i in g.indices], dtype=np.float32))
        for g in groups.values()
    ]
    out = reassemble(len(images), parts)
    assert out.dtype == np.float32 and out.shape == (6, 2)
    assert out[:, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_route_images_returns_only_used_ensembles():
    groups = route_images([b"x", b"y"])
    assert [g.kind for g in groups] == [IMAGE]


def test_unreadable_image_file_raises_client_error(tmp_path: Path):
    with pytest.raises(EmbeddingClientError, match="cannot read image file"):
        route_images([tmp_path / "missing.jpg"])


def test_route_images_rejects_unsupported_types_and_single_items():
    with pytest.raises(EmbeddingClientError, match=r"images\[0\] is int"):
        route_images([42])
    with pytest.raises(EmbeddingClientError, match="single image"):
        route_images(b"one image")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("clip", ("clip", None)),
        ("clip_image", ("clip", IMAGE)),
        ("clip_image_url", ("clip", IMAGE_URL)),
        ("clip_text", ("clip_text", None)),
    ],
)
def test_image_target_recognises_explicit_ensemble_names(model, expected):
    assert image_target(model) == expected


def test_forced_ensemble_rejects_inputs_it_cannot_take():
    with pytest.raises(EmbeddingClientError, match="_image_url"):
        route_images([b"bytes"], forced=IMAGE_URL)
    with pytest.raises(EmbeddingClientError, match="'_image'"):
        route_images(["https://example.org/x.png"], forced=IMAGE)
    assert route_images(["https://example.org/x.png"], forced=IMAGE_URL)[0].kind == IMAGE_URL


def test_reassemble_rejects_rows_that_do_not_match_indices():
    with pytest.raises(EmbeddingClientError, match="shapes disagree"):
        reassemble(2, [([0, 1], np.zeros((1, 4), dtype=np.float32))])


# --- statistics, index, config --------------------------------------------------------


def test_statistics_summary_from_http_json():
    ensemble, encoder = summarize_statistics(HTTP_STATS)
    assert isinstance(ensemble, ModelStats)
    assert (ensemble.name, ensemble.version) == ("all-MiniLM-L6-v2", "1")
    assert (ensemble.inference_count, ensemble.execution_count) == (96, 12)
    assert (ensemble.success_count, ensemble.fail_count) == (12, 2)
    assert ensemble.avg_request_ms == pytest.approx(40.0)
    assert ensemble.avg_queue_ms == pytest.approx(2.0)
    assert ensemble.avg_compute_input_ms == pytest.approx(0.1)
    assert ensemble.avg_compute_infer_ms == pytest.approx(35.0)
    assert ensemble.avg_compute_output_ms == pytest.approx(0.05)
    assert ensemble.batch_sizes == {8: 12}
    assert encoder.batch_sizes == {16: 2, 32: 2}
    assert list(encoder.batch_sizes) == [16, 32]
    assert encoder.avg_compute_infer_ms == pytest.approx(87.5)
    assert encoder.avg_batch_size == pytest.approx(24.0)


def test_statistics_summary_is_the_same_for_grpc_json():
    grpc_json = _grpc_json(HTTP_STATS, service_pb2.ModelStatisticsResponse())
    assert grpc_json["model_stats"][0]["inference_count"] == "96"  # int64 as string
    assert grpc_json["model_stats"][1]["inference_stats"]["fail"] == {}  # zeros omitted
    assert summarize_statistics(grpc_json) == summarize_statistics(HTTP_STATS)


def test_statistics_of_an_unused_model_are_zero():
    (stats,) = summarize_statistics({"model_stats": [{"name": "m", "version": "1"}]})
    assert stats.inference_count == 0 and stats.avg_queue_ms == 0.0
    assert stats.avg_batch_size == 0.0


def test_repository_index_parses_http_list_and_grpc_json():
    http_index = [
        {"name": "all-MiniLM-L6-v2", "version": "1", "state": "READY", "reason": ""},
        {"name": "broken", "state": "UNAVAILABLE", "reason": "failed to load"},
    ]
    expected = [
        ModelInfo("all-MiniLM-L6-v2", "1", "READY", ""),
        ModelInfo("broken", "", "UNAVAILABLE", "failed to load"),
    ]
    grpc_index = _grpc_json({"models": http_index}, service_pb2.RepositoryIndexResponse())
    assert parse_repository_index(http_index) == expected
    assert parse_repository_index(grpc_index) == expected


def test_model_config_is_unwrapped_from_grpc_response():
    config = {"name": "m", "max_batch_size": 64, "input": [{"name": "TEXT"}]}
    assert unwrap_model_config({"config": config}) == config
    assert unwrap_model_config(config) == config


def test_tables_list_models_and_stats():
    table = format_models([ModelInfo("all-MiniLM-L6-v2", "1", "READY", "")])
    assert table.splitlines()[1].split() == ["all-MiniLM-L6-v2", "1", "READY"]
    row = format_stats(summarize_statistics(HTTP_STATS))
    assert row.splitlines()[2].endswith("16:2 32:2")


# --- client without a server ------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_empty_inputs_return_empty_array_without_a_server(protocol):
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", protocol, timeout_s=2) as client:
        assert client.embed_texts("m", []).shape == (0, 0)
        out = client.embed_images("clip", [])
        assert out.shape == (0, 0) and out.dtype == np.float32


def test_precision_outputs_match_what_the_server_declares():
    from client.api import PRECISION_OUTPUTS
    from embed_runtime.engines.output_precision import FORMS

    assert PRECISION_OUTPUTS == {p: (name, dtype) for p, (name, dtype, _) in FORMS.items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_empty_inputs_come_back_in_the_precision_s_dtype(protocol):
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", protocol, timeout_s=2) as client:
        assert client.embed_texts("m", [], precision="ubinary").dtype == np.uint8
        assert client.embed_texts("m", [], precision="float16").dtype == np.float16


def test_text_calls_send_the_options_they_were_given_under_their_names(monkeypatch):
    sent = []
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", timeout_s=2) as client:
        monkeypatch.setattr(client, "_embed", lambda *args, **kwargs: sent.append(args[3]))
        monkeypatch.setattr(client, "_batched", lambda model, items, call: [call(items)])
        monkeypatch.setattr(client, "_infer_sparse", lambda m, items, p: sent.append(p) or [])
        client.embed_texts("m", ["a"], prompt_name="query", truncate=False)
        client.embed_texts("m", ["a"], dimensions=8, precision="int8")
        client.embed_texts_with_counts("m", ["a"], truncation_direction="left")
        client.embed_sparse("s", ["a"], task="query", max_active_dims=4, truncate=True)
        client.embed_sparse("s", ["a"])
    assert sent == [
        {"prompt_name": "query", "truncate": False},
        {"dimensions": 8, "precision": "int8"},
        {"truncation_direction": "left"},
        {"task": "query", "max_active_dims": 4, "truncate": True},
        {},
    ]


def test_unknown_precision_is_refused_before_sending():
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", timeout_s=2) as client:
        with pytest.raises(ValueError, match="precision must be one of float32, float16"):
            client.embed_texts("m", ["a"], precision="int4")


def test_cli_takes_a_precision_for_texts_only():
    assert parse_args(["embed", "--model", "m", "--precision", "ubinary", "a"]).precision == (
        "ubinary"
    )
    with pytest.raises(SystemExit):
        parse_args(["embed", "--model", "m", "--precision", "int8", "--image", "x.jpg"])


def test_default_url_depends_on_protocol():
    with EmbeddingClient(protocol="grpc") as grpc_client, EmbeddingClient() as http_client:
        assert grpc_client.url == "localhost:8001"
        assert http_client.url == "localhost:8000"


def test_unknown_protocol_is_rejected():
    with pytest.raises(EmbeddingClientError, match="protocol"):
        EmbeddingClient(protocol="websocket")


def test_url_with_a_scheme_is_rejected():
    with pytest.raises(EmbeddingClientError, match="without a scheme"):
        EmbeddingClient("http://localhost:8000")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server_raises_client_error_and_is_not_ready(protocol):
    with EmbeddingClient(f"127.0.0.1:{_closed_port()}", protocol, timeout_s=2) as client:
        assert client.is_server_ready() is False
        assert client.is_model_ready("m") is False
        with pytest.raises(EmbeddingClientError) as info:
            client.embed_texts("all-MiniLM-L6-v2", ["hello"])
        assert info.value.model == "all-MiniLM-L6-v2"


def test_client_error_string_names_model_and_status():
    err = EmbeddingClientError("unknown model", status="400", model="m")
    assert str(err) == "model 'm': unknown model (status 400)"


# --- CLI ------------------------------------------------------------------------------


def test_cli_parses_text_embedding_with_global_options_on_either_side():
    args = parse_args(["--protocol", "grpc", "embed", "--model", "mini", "a b", "c"])
    assert (args.command, args.model, args.texts, args.protocol) == (
        "embed",
        "mini",
        ["a b", "c"],
        "grpc",
    )
    args = parse_args(["embed", "--model", "mini", "x", "--url", "h:1", "--protocol", "grpc"])
    assert (args.url, args.protocol, args.timeout) == ("h:1", "grpc", 60.0)


def test_cli_parses_repeated_images_and_npy_output():
    args = parse_args(
        [
            "embed",
            "--model",
            "clip",
            "--image",
            "a.jpg",
            "--image",
            "https://x/y.png",
            "--format",
            "npy",
            "--out",
            "v.npy",
        ]
    )
    assert args.images == ["a.jpg", "https://x/y.png"] and args.texts == []
    assert (args.format, args.out) == ("npy", "v.npy")


@pytest.mark.parametrize(
    "argv",
    [
        ["embed", "--model", "m"],
        ["embed", "--model", "m", "text", "--image", "a.jpg"],
        ["embed", "--model", "m", "text", "--format", "npy"],
        ["embed", "text"],
        ["--protocol", "ws", "models"],
    ],
)
def test_cli_rejects_bad_argument_combinations(argv):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


def test_cli_parses_other_commands():
    assert parse_args(["models"]).command == "models"
    stats = parse_args(["stats", "--model", "m", "--json"])
    assert (stats.model, stats.json) == ("m", True)
    assert parse_args(["stats"]).model is None
    assert parse_args(["ready", "--model", "m"]).model == "m"


def test_cli_url_comes_from_flag_then_env_then_protocol_default():
    env = {"TRITON_URL": "triton:9000"}
    assert resolve_url("h:1", "http", env) == "h:1"
    assert resolve_url(None, "grpc", env) == "triton:9000"
    assert resolve_url(None, "http", {}) == "localhost:8000"
    assert resolve_url(None, "grpc", {}) == "localhost:8001"


def test_cli_exits_1_with_message_when_server_unreachable(capsys):
    env = {"TRITON_URL": f"127.0.0.1:{_closed_port()}"}
    code = main(["--timeout", "2", "embed", "--model", "mini", "hello"], environ=env)
    assert code == 1
    assert capsys.readouterr().err.startswith("error: model 'mini'")


def test_cli_ready_exits_1_when_server_unreachable(capsys):
    code = main(["ready", "--url", f"127.0.0.1:{_closed_port()}", "--timeout", "2"], environ={})
    assert code == 1
    assert "not ready" in capsys.readouterr().out


def test_admin_headers_name_the_key_for_each_protocol() -> None:
    from client.api import admin_headers

    assert admin_headers(None, "http") == {}
    assert admin_headers("k" * 20, "http") == {"X-Admin-Key": "k" * 20}
    assert admin_headers("k" * 20, "grpc") == {
        "x-admin-key": "k" * 20,
        "triton-grpc-protocol-x-admin-key": "k" * 20,
    }


def test_admin_key_comes_from_the_environment_or_its_file(tmp_path) -> None:
    from client.api import admin_key_from_env

    assert admin_key_from_env({}) is None
    assert admin_key_from_env({"EMBED_ADMIN_KEY": "abc"}) == "abc"
    key = tmp_path / "key"
    key.write_text("from-a-file\n")
    assert admin_key_from_env({"EMBED_ADMIN_KEY_FILE": str(key)}) == "from-a-file"
    with pytest.raises(EmbeddingClientError, match="cannot read EMBED_ADMIN_KEY_FILE"):
        admin_key_from_env({"EMBED_ADMIN_KEY_FILE": str(tmp_path / "missing")})


def test_the_grpc_channel_keeps_tritonclients_options_and_retries_a_lost_server_within_1_s(
    monkeypatch,
) -> None:
    import grpc
    import tritonclient.grpc as grpcclient

    keepalive = grpcclient.KeepAliveOptions()
    opened: list[dict] = []
    real = grpc.insecure_channel

    def channel(url, options=None, **kwargs):
        opened.append(dict(options or []))
        return real(url, options=options, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", channel)
    EmbeddingClient("127.0.0.1:1", protocol="grpc", admin_key="").close()
    args = opened[0]
    assert (
        args["grpc.max_send_message_length"]
        == args["grpc.max_receive_message_length"]
        == (2**31 - 1)
    )
    assert args["grpc.keepalive_time_ms"] == keepalive.keepalive_time_ms
    assert args["grpc.max_reconnect_backoff_ms"] == 1000
    assert args["grpc.initial_reconnect_backoff_ms"] == args["grpc.min_reconnect_backoff_ms"] == 250
