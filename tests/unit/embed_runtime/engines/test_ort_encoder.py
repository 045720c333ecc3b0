"""The ONNX Runtime encoder runner on tiny hand-built graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder, providers

VOCAB, DIM = 50, 8
RNG = np.random.default_rng(42)
TABLE = RNG.normal(size=(VOCAB, DIM)).astype(np.float32)
DENSE_W = RNG.normal(size=(3, DIM)).astype(np.float32)
BASE = {
    "onnx_file": "model.onnx",
    "input_names": "input_ids,attention_mask",
    "output_name": "EMBEDDING",
    "ragged": "true",
    "max_rows_per_run": "4",
}


def _save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def masked_mean_graph(path: Path, table: np.ndarray = TABLE) -> Path:
    """EMBEDDING = mean of the embedding-table rows of the real (mask == 1) tokens."""
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask")
    ]
    dim = table.shape[1]
    out = helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", dim])
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["EMBEDDING"]),
    ]
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
    ]
    return _save(helper.make_graph(nodes, "masked_mean", ints, [out], inits), path)


def dense_graph(path: Path) -> Path:
    """EMBEDDING = pixel_values @ W (fixed-shape input)."""
    inp = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3])
    out = helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", DIM])
    nodes = [helper.make_node("MatMul", ["pixel_values", "w"], ["EMBEDDING"])]
    inits = [numpy_helper.from_array(DENSE_W, "w")]
    return _save(helper.make_graph(nodes, "dense", [inp], [out], inits), path)


@pytest.fixture(scope="module")
def token_model(tmp_path_factory) -> Path:
    return masked_mean_graph(tmp_path_factory.mktemp("ort") / "model.onnx")


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory) -> Path:
    return dense_graph(tmp_path_factory.mktemp("ort") / "dense.onnx")


def _encoder(path: Path, **overrides: str) -> OrtEncoder:
    return OrtEncoder(str(path), EncoderParams.from_parameters({**BASE, **overrides}))


def _tokens(lengths: list[int], rng: np.random.Generator, extra_pad: int = 0, pad_id: int = 0):
    width = max(lengths) + extra_pad
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, VOCAB, size=n)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _expected(req: dict[str, np.ndarray]) -> np.ndarray:
    rows = []
    for ids, mask in zip(req["input_ids"], req["attention_mask"], strict=True):
        rows.append(TABLE[ids[mask == 1]].mean(axis=0))
    return np.stack(rows)


# --- EncoderParams ---------------------------------------------------------------------


def test_encoder_params_read_required_keys_and_defaults() -> None:
    params = EncoderParams.from_parameters(BASE)
    assert params.input_names == ("input_ids", "attention_mask")
    assert params.ragged is True
    assert params.max_rows_per_run == 4
    assert (params.max_tokens_per_run, params.intra_op_threads, params.inter_op_threads) == (
        0,
        0,
        1,
    )
    assert (params.graph_optimization, params.execution_provider) == ("all", "cpu")
    assert params.allow_spinning is True
    assert params.max_padding_share == 1.0


def test_encoder_params_read_optional_keys() -> None:
    raw = {
        **BASE,
        "ragged": "False",
        "max_tokens_per_run": "4096",
        "intra_op_threads": "2",
        "inter_op_threads": "3",
        "allow_spinning": "False",
        "max_padding_share": "0.25",
        "graph_optimization": "basic",
        "execution_provider": "cuda",
    }
    params = EncoderParams.from_parameters(raw)
    assert params.ragged is False
    assert params.max_tokens_per_run == 4096
    assert (params.intra_op_threads, params.inter_op_threads) == (2, 3)
    assert params.allow_spinning is False
    assert params.max_padding_share == 0.25
    assert (params.graph_optimization, params.execution_provider) == ("basic", "cuda")


@pytest.mark.parametrize("key", sorted(BASE))
def test_encoder_params_name_the_missing_key(key: str) -> None:
    raw = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(ValueError, match=f"encoder config parameter '{key}' is missing"):
        EncoderParams.from_parameters(raw)


def test_encoder_params_reject_unknown_graph_optimization() -> None:
    with pytest.raises(ValueError, match="graph_optimization must be one of"):
        EncoderParams.from_parameters({**BASE, "graph_optimization": "max"})


@pytest.mark.parametrize("rows", ["0", "-1"])
def test_encoder_params_reject_max_rows_per_run_below_one(rows: str) -> None:
    with pytest.raises(ValueError, match="max_rows_per_run must be >= 1"):
        EncoderParams.from_parameters({**BASE, "max_rows_per_run": rows})


@pytest.mark.parametrize("share", ["-0.5", "1.01"])
def test_encoder_params_reject_padding_share_outside_unit_range(share: str) -> None:
    with pytest.raises(ValueError, match=r"max_padding_share must be within \[0, 1\]"):
        EncoderParams.from_parameters({**BASE, "max_padding_share": share})


def test_encoder_params_reject_non_integer_max_rows() -> None:
    with pytest.raises(ValueError):
        EncoderParams.from_parameters({**BASE, "max_rows_per_run": "many"})


def test_encoder_params_reject_unknown_execution_provider() -> None:
    with pytest.raises(ValueError, match="execution_provider must be one of"):
        EncoderParams.from_parameters({**BASE, "execution_provider": "rocm"})


CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]
GPU_BUILD = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_cpu_provider_ignores_gpu_providers() -> None:
    assert providers("cpu", 0, GPU_BUILD) == ["CPUExecutionProvider"]


@pytest.mark.parametrize("name", ["cuda", "tensorrt"])
def test_gpu_provider_without_onnxruntime_gpu_fails_instead_of_running_on_cpu(name) -> None:
    with pytest.raises(RuntimeError, match="needs onnxruntime-gpu"):
        providers(name, 0, CPU_ONLY)


def test_gpu_providers_pin_the_instance_device() -> None:
    assert providers("cuda", 3, GPU_BUILD) == [
        ("CUDAExecutionProvider", {"device_id": 3}),
        "CPUExecutionProvider",
    ]
    assert providers("tensorrt", 1, GPU_BUILD)[:2] == [
        ("TensorrtExecutionProvider", {"device_id": 1}),
        ("CUDAExecutionProvider", {"device_id": 1}),
    ]


def test_tensorrt_falls_back_to_cuda_when_its_provider_is_missing() -> None:
    chain = providers("tensorrt", 0, GPU_BUILD[1:])
    assert chain[0] == ("CUDAExecutionProvider", {"device_id": 0})


def test_cpu_only_onnxruntime_refuses_a_cuda_encoder(token_model: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(RuntimeError, match="needs onnxruntime-gpu"):
        _encoder(token_model, execution_provider="cuda")


# --- OrtEncoder ------------------------------------------------------------------------


def test_encoder_refuses_graph_lacking_configured_inputs(token_model: Path) -> None:
    with pytest.raises(ValueError, match=r"lacks inputs \['token_type_ids'\]"):
        _encoder(token_model, input_names="input_ids,attention_mask,token_type_ids")


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_encoder_builds_with_every_graph_optimization_level(token_model: Path, level: str):
    enc = _encoder(token_model, graph_optimization=level)
    req = _tokens([3], np.random.default_rng(0))
    np.testing.assert_allclose(enc.encode_tokens([req])[0], _expected(req), rtol=1e-5, atol=1e-6)


def test_encode_tokens_matches_masked_mean_per_request(token_model: Path) -> None:
    rng = np.random.default_rng(1)
    requests = [_tokens([3, 7], rng), _tokens([1], rng), _tokens([5, 2, 9], rng)]
    outputs = _encoder(token_model).encode_tokens(requests)
    assert [o.shape for o in outputs] == [(2, DIM), (1, DIM), (3, DIM)]
    for req, out in zip(requests, outputs, strict=True):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, _expected(req), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_encode_tokens_results_do_not_depend_on_padding_or_grouping(
    token_model: Path, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    rows = [_tokens([int(n)], rng) for n in rng.integers(1, 30, size=12)]
    single = _encoder(token_model)
    alone = [single.encode_tokens([r])[0] for r in rows]

    # Regroup the same rows into requests with extra padding and a non-zero pad id.
    sizes = [3, 1, 5, 3]
    requests, start = [], 0
    for size in sizes:
        group = rows[start : start + size]
        width = max(r["input_ids"].shape[1] for r in group) + int(rng.integers(0, 4))
        ids = np.full((size, width), 7, dtype=np.int64)
        mask = np.zeros((size, width), dtype=np.int64)
        for i, r in enumerate(group):
            n = r["input_ids"].shape[1]
            ids[i, :n] = r["input_ids"][0]
            mask[i, :n] = 1
        requests.append({"input_ids": ids, "attention_mask": mask})
        start += size

    for rows_per_run, tokens_per_run in [("1", "0"), ("4", "0"), ("64", "0"), ("8", "40")]:
        enc = _encoder(
            token_model, max_rows_per_run=rows_per_run, max_tokens_per_run=tokens_per_run
        )
        got = np.concatenate(enc.encode_tokens(requests))
        np.testing.assert_allclose(got, np.concatenate(alone), rtol=1e-5, atol=1e-6)


def test_encode_tokens_runs_length_sorted_chunks_within_limits(token_model: Path) -> None:
    enc = _encoder(token_model, max_rows_per_run="3")
    calls = []
    real_run = enc._run

    def spy(inputs):
        calls.append(inputs["input_ids"].shape)
        return real_run(inputs)

    enc._run = spy
    rng = np.random.default_rng(2)
    enc.encode_tokens([_tokens([9, 1, 4], rng), _tokens([2, 8, 3, 5], rng)])
    assert [rows for rows, _ in calls] == [3, 3, 1]
    assert [width for _, width in calls] == [3, 8, 9]


def test_encode_dense_chunks_by_max_rows_and_keeps_request_order(dense_model: Path) -> None:
    enc = _encoder(dense_model, input_names="pixel_values", ragged="false", max_rows_per_run="2")
    calls = []
    real_run = enc._run

    def spy(inputs):
        calls.append(len(inputs["pixel_values"]))
        return real_run(inputs)

    enc._run = spy
    rng = np.random.default_rng(3)
    requests = [rng.normal(size=(n, 3)).astype(np.float32) for n in (3, 1, 1)]
    outputs = enc.encode_dense(requests)
    assert calls == [2, 2, 1]
    assert [o.shape for o in outputs] == [(3, DIM), (1, DIM), (1, DIM)]
    for req, out in zip(requests, outputs, strict=True):
        np.testing.assert_allclose(out, req @ DENSE_W, rtol=1e-5, atol=1e-5)


def test_encode_dense_results_do_not_depend_on_chunk_size(dense_model: Path) -> None:
    rng = np.random.default_rng(4)
    requests = [rng.normal(size=(n, 3)).astype(np.float32) for n in (4, 2, 7)]
    results = []
    for rows in ("1", "3", "100"):
        enc = _encoder(
            dense_model, input_names="pixel_values", ragged="false", max_rows_per_run=rows
        )
        results.append(np.concatenate(enc.encode_dense(requests)))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(results[0], results[2], rtol=1e-6, atol=1e-6)
