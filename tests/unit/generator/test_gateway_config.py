"""The gateway's config (LiteLLM proxy) generated from a manifest: routes, flags, no secrets."""

from __future__ import annotations

from pathlib import Path

import yaml

from generator.cli import main
from generator.gateway import gateway_config, write_gateway_config
from generator.manifest import load_manifest, parse_manifest

ROOT = Path(__file__).resolve().parents[3]


def _manifest(tmp_path: Path):
    models = [
        {"name": "st", "family": "sentence-transformers", "source": "x", "max_batch_size": 8,
         "token_count": True},
        {"name": "st-native", "family": "sentence-transformers", "source": "x",
         "encoder_backend": "onnxruntime", "litellm": True},
        {"name": "shipped", "family": "sentence-transformers", "source": "x", "litellm": True},
        {"name": "clip", "family": "open-clip", "arch": "ViT-B-32", "pretrained": "openai"},
        {"name": "rr", "family": "cross-encoder", "source": "x"},
    ]
    return parse_manifest({"models": models}, tmp_path)


def test_every_dense_text_ensemble_gets_a_route_under_its_triton_name(tmp_path) -> None:
    routes = {r["model_name"]: r for r in gateway_config(_manifest(tmp_path))["model_list"]}
    assert list(routes) == ["st", "st-native", "shipped", "clip_text"]
    assert routes["st"]["litellm_params"] == {
        "model": "triton-embeddings/st",
        "api_base": "os.environ/TRITON_HTTP_URL",
    }
    assert routes["st"]["model_info"] == {
        "mode": "embedding", "public_name": "st", "max_batch_size": 8, "dimensions": True,
        "token_count": True,
    }
    assert routes["st-native"]["model_info"]["dimensions"] is False
    assert routes["st-native"]["model_info"]["token_count"] is False
    assert routes["clip_text"]["model_info"]["dimensions"] is False
    assert routes["clip_text"]["model_info"]["token_count"] is False


def test_a_litellm_entry_is_served_through_its_openai_ensemble_which_counts(tmp_path) -> None:
    """``litellm = true`` (the shipped all-MiniLM-L6-v2): usage from ``<name>_openai``."""
    manifest = _manifest(tmp_path)
    routes = {r["model_name"]: r for r in gateway_config(manifest)["model_list"]}
    shipped = routes["shipped"]
    assert shipped["litellm_params"]["model"] == "triton-embeddings/shipped_openai"
    assert shipped["model_info"]["public_name"] == "shipped"
    assert shipped["model_info"]["token_count"] is True
    assert "shipped_openai" in manifest.get("shipped").ensembles
    # Triton's native backend cannot count: no <name>_openai, the plain ensemble, usage 0.
    assert routes["st-native"]["litellm_params"]["model"] == "triton-embeddings/st-native"
    assert "st-native_openai" not in manifest.get("st-native").ensembles


def test_config_requires_a_key_from_the_environment_and_writes_no_secret(tmp_path) -> None:
    path = tmp_path / "gateway" / "config.yaml"
    write_gateway_config(_manifest(tmp_path), path)
    config = yaml.safe_load(path.read_text())
    general = config["general_settings"]
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert general["custom_auth"] == "triton_embeddings.user_api_key_auth"
    assert config["litellm_settings"]["telemetry"] is False
    assert config["litellm_settings"]["drop_params"] is False
    assert "sk-" not in path.read_text()


def test_cli_writes_the_shipped_manifests_routes(tmp_path, capsys) -> None:
    out = tmp_path / "config.yaml"
    assert main(["--manifest", str(ROOT / "models.toml"), "--repo", str(tmp_path / "repo"),
                 "gateway-config", str(out)]) == 0
    names = [r["model_name"] for r in yaml.safe_load(out.read_text())["model_list"]]
    shipped = load_manifest(ROOT / "models.toml")
    want = [
        f"{e.name}_text" if e.family == "open-clip" else e.name
        for e in shipped.models
        if e.family in ("sentence-transformers", "open-clip")
    ]
    assert names == want and "all-MiniLM-L6-v2" in names
    assert "all-MiniLM-L6-v2" in capsys.readouterr().out
