"""The gateway's config generated from a manifest: models, flags, no secrets."""

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
    routes = {r["name"]: r for r in gateway_config(_manifest(tmp_path))["models"]}
    assert list(routes) == ["st", "st-native", "shipped", "clip_text"]
    assert routes["st"] == {
        "name": "st", "ensemble": "st", "max_batch_size": 8, "dimensions": True,
        "token_count": True,
    }
    assert routes["st-native"]["dimensions"] is False
    assert routes["st-native"]["token_count"] is False
    assert routes["clip_text"]["ensemble"] == "clip_text"
    assert routes["clip_text"]["dimensions"] is False
    assert routes["clip_text"]["token_count"] is False


def test_a_litellm_entry_is_served_through_its_openai_ensemble_which_counts(tmp_path) -> None:
    """``litellm = true`` (the shipped all-MiniLM-L6-v2): usage from ``<name>_openai``."""
    manifest = _manifest(tmp_path)
    routes = {r["name"]: r for r in gateway_config(manifest)["models"]}
    shipped = routes["shipped"]
    assert shipped["ensemble"] == "shipped_openai"
    assert shipped["token_count"] is True
    assert "shipped_openai" in manifest.get("shipped").ensembles
    # Triton's native backend cannot count: no <name>_openai, the plain ensemble, usage 0.
    assert routes["st-native"]["ensemble"] == "st-native"
    assert "st-native_openai" not in manifest.get("st-native").ensembles


def test_config_holds_the_models_only_and_no_secret(tmp_path) -> None:
    path = tmp_path / "gateway" / "config.yaml"
    write_gateway_config(_manifest(tmp_path), path)
    config = yaml.safe_load(path.read_text())
    assert list(config) == ["models"]
    assert "sk-" not in path.read_text() and "http" not in path.read_text()


def test_cli_writes_the_shipped_manifests_routes(tmp_path, capsys) -> None:
    out = tmp_path / "config.yaml"
    assert main(["--manifest", str(ROOT / "models.toml"), "--repo", str(tmp_path / "repo"),
                 "gateway-config", str(out)]) == 0
    names = [r["name"] for r in yaml.safe_load(out.read_text())["models"]]
    shipped = load_manifest(ROOT / "models.toml")
    want = [
        f"{e.name}_text" if e.family == "open-clip" else e.name
        for e in shipped.models
        if e.family in ("sentence-transformers", "open-clip")
    ]
    assert names == want and "all-MiniLM-L6-v2" in names
    assert "all-MiniLM-L6-v2" in capsys.readouterr().out
