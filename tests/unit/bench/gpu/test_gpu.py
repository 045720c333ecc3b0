"""The GPU benchmark's pieces that run without a GPU: report, manifest, placement check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from bench.gpu import report as gpu_report
from bench.gpu.run import manifest_data
from embed_runtime.engines.ort_encoder import checked_placement
from generator.manifest import ManifestError, load_manifest, parse_manifest

ROOT = Path(__file__).resolve().parents[4]


def _run(model: str, concurrency: int, qps: float, util: float = 50.0) -> dict:
    return {
        "model": model, "concurrency": concurrency, "qps": qps, "p50_ms": 10.0,
        "p99_ms": 20.0, "server_queue_ms": 0.0, "server_compute_ms": 8.0,
        "gpu_util_mean": util, "gpu_util_max": util + 10, "gpu_mem_max_mib": 4000,
    }


def _results(models: str, runs: list[dict], ceilings: dict, settings: str = "[]") -> dict:
    return {
        "meta": {
            "started": f"2026-11-24T0000{len(runs):02d}Z",
            "args": {"models": models, "measurement_ms": "3000", "set": settings},
            "machine": {"gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_mib": 81559,
                        "driver": "580.159.04", "cpu_cores": 16, "python": "3.12.3",
                        "onnxruntime": "1.31.1"},
        },
        "placement": {"encoder_gpu_mib": {"e5-small-random_encode": 1392}},
        "parity": {"sentences": 64, "min_cosine": 0.9999994, "max_abs": 3.9e-4,
                   "gate_min_cosine": 0.999, "passed": True},
        "runs": runs,
        "ceilings": ceilings,
    }


TEXT = _results(
    "text",
    [_run("e5-small-random", 512, 9578.8), _run("e5-small-random", 2048, 10967.8),
     {"model": "e5-small-random", "concurrency": 4096, "error": "error: ran out of time"}],
    {"text_ort": {"by_batch": {"64": 8145.4, "256": 10595.4}}, "text_torch_fp16":
     {"items_per_s": 1761.0}},
    "['text.encoder_instances=6']",
)
CLIP = _results(
    "clip",
    [_run("clip-vit-b-32_text", 1024, 9269.9), _run("clip-vit-b-32_image", 256, 716.3, 19)],
    {"clip_text_ort": {"items_per_s": 19538.8}, "image_tower_ort": {"items_per_s": 6620.4},
     "image_preprocess_cpu": {"processes": 16, "items_per_s": 1035.6}},
)


def test_gpu_section_names_best_run_ceiling_and_target_per_ensemble() -> None:
    text = gpu_report.render_gpu_section([TEXT, CLIP])
    assert text.startswith(gpu_report.BEGIN) and text.endswith(gpu_report.END)
    best = "| `e5-small-random` (text.encoder_instances=6) | 10,968 | 2048 | 10.0 | 50 % | 10,595"
    assert best + " | 1.04 x | 10,000 | met |" in text
    clip_text = "| `clip-vit-b-32_text` | 9,270 | 1024 | 10.0 | 50 % | 19,539 | 0.47 x | 5,000 |"
    assert clip_text + " met |" in text
    # Images are held against the slower of the GPU tower and the CPU decode.
    image = "| `clip-vit-b-32_image` | 716 | 256 | 10.0 | 19 % | 1,036 | 0.69 x | 1,500 |"
    assert image + " not met |" in text
    assert "failed: ran out of time" in text
    assert "cosine >= 0.999999" in text


def test_gpu_manifest_is_valid_and_takes_overrides() -> None:
    data = manifest_data(Path("/models/e5"), "fp16", ["text.encoder_instances=6",
                                                      "clip.image_draft_decode=true"])
    manifest = parse_manifest(data, ROOT, "gpu bench manifest")
    text, clip = manifest.models
    assert (text.device, clip.device) == ("gpu", "gpu")
    assert text.precision == "fp16" and text.encoder_instances == 6
    assert clip.image_draft_decode is True
    assert "127.0.0.1" in manifest.fetch_image.allow_hosts
    # Every other serving knob is the GPU deployment's own.
    shipped = {e.family: e for e in load_manifest(ROOT / "deploy" / "models.toml").models}
    for entry in (text, clip):
        for knob in ("max_batch_size", "max_queue_delay_us", "max_rows_per_run",
                     "preprocess_instances", "max_batch_pixels"):
            assert getattr(entry, knob) == getattr(shipped[entry.family], knob), knob
    assert clip.encoder_instances == shipped["open-clip"].encoder_instances


def test_gpu_manifest_refuses_an_unknown_knob() -> None:
    data = manifest_data(Path("/models/e5"), "fp16", ["text.encoder_instancez=6"])
    with pytest.raises(ManifestError, match="encoder_instancez"):
        parse_manifest(data, ROOT, "gpu bench manifest")


class _Session:
    def __init__(self, placed: list[str]):
        self.placed = placed

    def get_providers(self) -> list[str]:
        return self.placed


def test_cuda_session_that_fell_back_to_the_cpu_is_refused() -> None:
    with pytest.raises(RuntimeError, match="placed the session on"):
        checked_placement(_Session(["CPUExecutionProvider"]), "cuda")


@pytest.mark.parametrize(
    ("asked", "placed"),
    [("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"]),
     ("tensorrt", ["TensorrtExecutionProvider", "CUDAExecutionProvider"]),
     ("cpu", ["CPUExecutionProvider"])],
)
def test_session_on_the_asked_device_is_kept(asked: str, placed: list[str]) -> None:
    session = _Session(placed)
    assert checked_placement(session, asked) is session


def test_preprocess_rate_runs_the_served_preprocessing_on_every_core(tmp_path: Path) -> None:
    from bench.gpu.rates import preprocess_ceiling
    from client.load.workload import generated_images

    params = {
        "image_size": "224,224", "resize_mode": "shortest", "interpolation": "bicubic",
        "mean": "0.48145466,0.4578275,0.40821073", "std": "0.26862954,0.26130258,0.27577711",
        "fill_color": "0", "max_image_pixels": "16777216", "max_batch_pixels": "67108864",
        "max_bytes": "20971520", "apply_exif": "true",
    }
    model = tmp_path / "m_preprocess_image"
    model.mkdir()
    model.joinpath("config.pbtxt").write_text(
        'name: "m_preprocess_image"\nbackend: "python"\n' + "".join(
            f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
            for k, v in params.items()
        )
    )
    photos = dict(list(generated_images().items())[:2])
    rate = preprocess_ceiling(tmp_path, "m", photos, rounds=1)
    assert rate["processes"] == (os.cpu_count() or 1)
    assert rate["items_per_s"] > 0


GPU_IMAGE_RUN = ROOT / "bench" / "results" / "gpu-all-2026-11-24T225522Z.json"


def test_recorded_gpu_image_decode_meets_its_parity_gate_and_fails_bad_jpegs_alone() -> None:
    """The H100 run docs/benchmarks.md quotes: gate min cosine >= IMAGE_GPU_MIN_COSINE."""
    import json

    result = json.loads(GPU_IMAGE_RUN.read_text())
    assert result["meta"]["manifest"]["models"][1]["image_decode"] == "gpu"
    parity = result["ceilings"]["image_gpu_parity"]
    gate = gpu_report.IMAGE_GPU_MIN_COSINE
    assert parity["summary"]["gpu_default"]["min_cosine"] >= gate
    assert result["image_gpu"]["served_parity"]["min_cosine"] >= gate
    assert len(parity["photos"]) >= 30
    for row in parity["photos"]:  # JPEGs on the GPU, every other format on the exact path
        assert row["gpu_decoded"] == row["photo"].endswith(".jpg"), row["photo"]
        if not row["gpu_decoded"]:
            assert row["gpu_default"]["max_levels"] == 0.0
    safety = result["image_gpu"]["safety"]
    assert safety["good_ok"] == safety["good_sent"] and safety["server_still_ready"]
    for case in ("truncated", "huge_header"):
        assert "INVALID_ARGUMENT" in safety["bad"][case]
    section = gpu_report.render_gpu_section([result])
    minimum = parity["summary"]["gpu_default"]["min_cosine"]
    assert f"GPU path {minimum:.7f}" in section and f">= {gate}" in section
    assert f"GPU path {minimum:.7f}" in (ROOT / "docs" / "benchmarks.md").read_text()
