"""Share of open_clip's architectures that the project builds exactly (offline, random init).

For every name of ``open_clip.list_models()``: its config reduced to a size a 2-core box
creates and exports in seconds (every transformer or CNN tower at most 2 layers / one block
per stage, timm towers through their own ``depth`` / ``depths`` / ``layers`` arguments
where they take one; widths, heads, pooling, projections, image size and tokenizer kept),
created with random weights (seeded), saved, and built through the family's ``build()``
(the path of ``generator build`` and ``model_manager``: load, refusals, tokenizer.json and
its check, both towers exported and held to PyTorch). Each is classified:

- ``exact``: built; both towers within the export gate (1e-4 / cos 0.9999) and the
  tokenizer check passed;
- ``exact-stand-in-tokenizer``: as exact, with a stand-in for a Hugging Face tokenizer
  (made offline with ``tokenizers``, the kind the config names: T5-like Unigram for
  SigLIP, Gemma-like BPE for SigLIP2, WordPiece for BERT, XLM-R-like Unigram for XLM-R and
  XLM-V) in a ``local-dir:`` folder,
  since the hub's files cannot be read here;
- ``refused``: ``UnsupportedModelError`` naming the part (or a parity failure of the gate);
- ``offline``: cannot be created here at all (a Hugging Face text model's config.json
  comes from the hub);
- ``crash``: any other exception (a bug).

Usage::

    python -m bench.open_clip_coverage [--budget-s 1200] [--only NAME ...] [--json out.json]

Architectures are visited round-robin over structural classes (tower kind, tokenizer kind),
so a time-boxed run covers every class before repeating one; the rest are listed as not run.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

_TIMM_REDUCTION = (  # (name prefixes, shallower, also narrower); full size if none fits
    (("vit_", "eva", "vitamin"), {"depth": 2}, {"embed_dim": 64, "num_heads": 2}),
    (("convnext",), {"depths": (1, 1, 1, 1)}, {"dims": (32, 64, 128, 256)}),
    (("swin",), {"depths": (1, 1, 1, 1)}, {"embed_dim": 32, "num_heads": (1, 2, 4, 8)}),
    (("fastvit",), {"layers": (1, 1, 1, 1)}, {"embed_dims": (32, 64, 128, 256)}),
)
NARROW = {"vision": 128, "resnet": 32, "text": 128, "heads": 2}


def _structure(cfg: dict) -> tuple[str, str, str]:
    text, vision = cfg.get("text_cfg", {}), cfg.get("vision_cfg", {})
    if "hf_model_name" in text:
        text_kind = "hf-text-model"
    elif text.get("hf_tokenizer_name"):
        text_kind = "hf-tokenizer"
    else:
        text_kind = "clip-bpe"
    if vision.get("timm_model_name"):
        vision_kind = "timm:" + vision["timm_model_name"].split("_")[0]
    elif isinstance(vision.get("layers"), (list, tuple)):
        vision_kind = "resnet"
    else:
        vision_kind = "vit"
    return text_kind, vision_kind, "coca" if "multimodal_cfg" in cfg else "clip"


def reduce_config(cfg: dict, narrow: bool = False) -> dict:
    """``cfg`` with every open_clip-built tower cut to 2 layers (ResNet: 1 block per stage).

    ``narrow`` also cuts their widths (ViT 128, 2 heads of 64; ResNet base 32; text 128,
    2 heads); the image size, patch size, pooling and projection stay.
    """
    cfg = copy.deepcopy(cfg)
    vision = cfg.get("vision_cfg", {})
    if not vision.get("timm_model_name"):
        layers = vision.get("layers", 12)
        resnet = isinstance(layers, (list, tuple))
        vision["layers"] = (1, 1, 1, 1) if resnet else min(layers, 2)
        if narrow:
            vision["width"] = NARROW["resnet"] if resnet else NARROW["vision"]
            vision["head_width"] = NARROW["vision"] // NARROW["heads"]
    text_unprojected = cfg.get("text_cfg", {}).get("proj_type") == "none"
    for key in ("text_cfg", "multimodal_cfg"):
        tower = cfg.get(key)
        if tower is None or "hf_model_name" in tower:
            continue
        tower["layers"] = min(tower.get("layers", 12), 2 if key == "text_cfg" else 1)
        if narrow and not text_unprojected:  # its width is the embedding's
            tower["width"], tower["heads"] = NARROW["text"], NARROW["heads"]
    return cfg


def narrows_timm(cfg: dict) -> bool:
    """Whether a timm image tower may be built narrower: not where its width is the output."""
    return cfg.get("vision_cfg", {}).get("timm_proj") not in (None, "none", "")


def _smoke(model, img_size=None) -> None:
    """One forward at the model's input size: a reduction that builds but cannot run fails."""
    import torch

    size = getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[1:]
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, *size))


@contextmanager
def reduced_timm(narrow: list[bool]):
    """timm.create_model builds the named tower shallower where it can.

    Also narrower while ``narrow[0]`` is set (per architecture: :func:`narrows_timm`).
    """
    import timm

    original = timm.create_model

    def create(name, *args, **kwargs):
        for prefixes, shallow, thin in _TIMM_REDUCTION:
            if name.startswith(prefixes):
                for extra in ({**shallow, **thin}, shallow) if narrow[0] else (shallow,):
                    try:
                        model = original(name, *args, **{**kwargs, **extra})
                        _smoke(
                            model, kwargs.get("img_size")
                        )  # e.g. fastvit_mci3 has 5 stages: 4 build, then fail
                        return model
                    except Exception:  # noqa: BLE001 - this model takes no such kwargs
                        continue
        return original(name, *args, **kwargs)

    timm.create_model = create
    try:
        yield
    finally:
        timm.create_model = original


def _stand_in_tokenizer(folder: Path, text_cfg: dict) -> None:
    from generator.fixtures.tiny_tokenizers import (
        write_tiny_gemma_like_tokenizer,
        write_tiny_hf_tokenizer,
        write_tiny_wordpiece_tokenizer,
        write_tiny_xlmr_tokenizer,
    )

    name = text_cfg["hf_tokenizer_name"].lower()
    vocab = min(600, int(text_cfg.get("vocab_size", 600)))
    if "siglip2" in name or "gemma" in name:
        write_tiny_gemma_like_tokenizer(folder, vocab)
    elif "bert" in name and "roberta" not in name:
        write_tiny_wordpiece_tokenizer(folder, vocab)
    elif "xlm-" in name:  # XLM-R, XLM-V (worldwide): XLMRobertaTokenizerFast
        write_tiny_xlmr_tokenizer(folder, vocab)
    else:
        write_tiny_hf_tokenizer(folder, vocab)


def _prepare(name: str, cfg: dict, folder: Path) -> tuple[dict, str]:
    """Create and save the reduced model; the manifest fields and its tokenizer kind."""
    import open_clip
    import torch

    folder.mkdir(parents=True)
    arch = f"cov-{name}"
    config = folder / f"{arch}.json"
    config.write_text(json.dumps(cfg))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model(arch, pretrained=None)
    if cfg["text_cfg"].get("hf_tokenizer_name"):
        _stand_in_tokenizer(folder, cfg["text_cfg"])
        local = {"model_cfg": cfg, "preprocess_cfg": {}}
        (folder / "open_clip_config.json").write_text(json.dumps(local))
        torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
        return {"arch": f"local-dir:{folder}"}, "stand-in"
    torch.save(model.state_dict(), folder / "weights.pt")
    return {"arch": str(config), "checkpoint": str(folder / "weights.pt")}, "own"


def check_one(name: str, work: Path, narrow: bool = False, timm_narrow=None) -> tuple[str, str]:
    """(class, detail) for one open_clip architecture."""
    import open_clip

    from generator.declared_kind import UnsupportedModelError
    from generator.families.open_clip.export import build
    from generator.manifest import parse_manifest
    from generator.onnx_export import ExportValidationError

    cfg = open_clip.get_model_config(name)
    if "hf_model_name" in cfg.get("text_cfg", {}):
        return "offline", f"text model {cfg['text_cfg']['hf_model_name']!r} needs the hub"
    if timm_narrow is not None:
        timm_narrow[0] = narrow and narrows_timm(cfg)
    try:
        try:
            fields, tokenizer = _prepare(name, reduce_config(cfg, narrow), work / name)
        except Exception:
            if not narrow:
                raise
            shutil.rmtree(work / name, ignore_errors=True)  # this config takes no narrowing
            fields, tokenizer = _prepare(name, reduce_config(cfg), work / name)
        entry = {"name": "m", "family": "open-clip", "max_batch_size": 4, **fields}
        manifest = parse_manifest({"models": [entry]}, work)
        out = work / name / "build"
        out.mkdir()
        build(manifest.models[0], manifest, out)
    except UnsupportedModelError as exc:
        return "refused", str(exc).splitlines()[0][:300]
    except ExportValidationError as exc:
        return "refused", "parity gate: " + "; ".join(exc.failures)[:300]
    except Exception as exc:  # noqa: BLE001 - every other failure is what this counts
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return "crash", f"{type(exc).__name__}: {str(exc)[:200]} ({where.filename}:{where.lineno})"
    return ("exact" if tokenizer == "own" else "exact-stand-in-tokenizer"), ""


def _order(names: list[str]) -> list[str]:
    import open_clip

    classes: dict[tuple, list[str]] = defaultdict(list)
    for name in sorted(names):
        classes[_structure(open_clip.get_model_config(name))].append(name)
    queues = [classes[k] for k in sorted(classes)]
    ordered = []
    while any(queues):
        ordered += [q.pop(0) for q in queues if q]
    return ordered


def main(argv: list[str] | None = None) -> int:
    """Run the survey; print one line per architecture, then the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=1200.0)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--narrow", action="store_true", help="also cut tower widths")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import open_clip
    import torch

    torch.set_num_threads(2)
    names = args.only or open_clip.list_models()
    ordered = _order(names)
    results: dict[str, tuple[str, str, float]] = {}
    start = time.monotonic()
    timm_narrow = [args.narrow]
    with tempfile.TemporaryDirectory() as tmp, reduced_timm(timm_narrow):
        for name in ordered:
            if time.monotonic() - start > args.budget_s:
                results[name] = ("not-run", "time box", 0.0)
                continue
            t0 = time.monotonic()
            kind, detail = check_one(name, Path(tmp), args.narrow, timm_narrow)
            results[name] = (kind, detail, time.monotonic() - t0)
            print(f"{name:40s} {kind:26s} {results[name][2]:5.1f}s {detail}", flush=True)
            gc.collect()
    counts = Counter(kind for kind, _, _ in results.values())
    total = len(results)
    print(f"\n{total} architectures, {time.monotonic() - start:.0f} s")
    for kind, n in counts.most_common():
        print(f"  {kind:26s} {n:4d}  ({100 * n / total:.0f}%)")
    if args.json:
        args.json.write_text(json.dumps({k: list(v) for k, v in results.items()}, indent=1))
    return 1 if counts.get("crash") else 0


if __name__ == "__main__":
    sys.exit(main())
