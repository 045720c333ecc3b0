"""Family ``open-clip``: text and image towers plus in-Triton preprocessing.

Models dirs of one entry ``<name>``: ``<name>_tokenize`` (open_clip's text clean in
Python, then an HF ``tokenizers`` JSON that reproduces open_clip's tokenizer, fixed
context), ``<name>_encode_text``,
``<name>_admit_image`` and ``<name>_admit_url`` (where the entry admits requests:
refuse before the decode, and before the URL fetch, while the preprocessing queue is
full), ``<name>_preprocess_image`` (Pillow + numpy,
parameters from the model's own ``PreprocessCfg``), ``<name>_encode_image``, and the
ensembles ``<name>_text``, ``<name>_image`` and ``<name>_image_url`` (the last one
through the shared ``fetch_image``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from embed_runtime.image.gpu import require_cuda_device
from embed_runtime.serving.admission import ADMISSION_PEEK, BACKLOG_PARAMETER

from ...manifest import Manifest, ModelEntry, resolve_path
from ...model_dir import ModelDir
from ...render import Instances, IOSpec, python_model
from ..common import (
    admission_parameters,
    admits,
    chain_dir,
    encoder_dir,
    step_batching,
    tokenize_dir,
)
from . import FETCH_IMAGE
from .assets import (
    embedding_dim,
    export_towers,
    image_graph_spec,
    load_open_clip,
    preprocess_params_from_model,
    score_parameters,
    text_graph_spec,
    write_tokenizer_json,
)
from .hf_tokenizer import is_hf_tokenizer, write_hf_tokenizer_json
from .preprocess_cfg import PreprocessChoice

ADMITTED = "ADMITTED"  # the admit step's output: the image bytes it let through


def _load(entry: ModelEntry, manifest: Manifest):
    arch = entry.arch or ""
    if arch.endswith(".json"):
        arch = str(resolve_path(manifest, arch))
    checkpoint = None
    if entry.checkpoint:
        path = resolve_path(manifest, entry.checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"{entry.name}: checkpoint {path} does not exist")
        checkpoint = str(path)
    return load_open_clip(
        arch,
        pretrained=entry.pretrained,
        checkpoint=checkpoint,
        preprocess=PreprocessChoice.from_entry(entry),
    )


def _vocab_size(model) -> int:
    """Rows of the text tower's token embedding (CLIP, CustomTextCLIP, CoCa, HF towers)."""
    text = getattr(model, "text", None)
    for owner in (model, text):
        embedding = getattr(owner, "token_embedding", None)
        if embedding is not None:
            return int(embedding.num_embeddings)
    for owner in (text, getattr(text, "transformer", None)):
        getter = getattr(owner, "get_input_embeddings", None)
        if callable(getter):
            return int(getter().num_embeddings)
    raise ValueError(f"cannot find the token embedding of {type(model).__name__}'s text tower")


def _preprocess_dir(
    entry: ModelEntry, name: str, parameters: dict[str, str], size, encoder: str
) -> ModelDir:
    # GPU decode: each instance is placed on a GPU (Triton passes its device id).
    kind = "KIND_GPU" if entry.image_decode == "gpu" else "KIND_CPU"
    admitted = admits(entry)
    config = python_model(
        name,
        entry.max_batch_size,
        [IOSpec("IMAGE", "TYPE_STRING", (1,))],
        [IOSpec("pixel_values", "TYPE_FP32", (3, *size))],
        {
            **parameters,
            "decode_threads": "2",
            **admission_parameters(entry, encoder),
            **({BACKLOG_PARAMETER: "true"} if admitted else {}),
        },
        # Decoding is the work to refuse before: ``<name>_admit_image`` in front admits to
        # this step as this step admits to the encoder. Without admission, Triton's own
        # bound (max_queue_size) keeps this queue short.
        step_batching(entry, entry.max_queue_delay_us // 2, admitted=admitted),
        Instances(entry.preprocess_instances, kind),
    )
    return ModelDir(name, config, "preprocess_image", {})


def _admit_dir(entry: ModelEntry, name: str, preprocess: str, *, peek: bool = False) -> ModelDir:
    """``<name>_admit_image``: image bytes passed on, or refused while ``preprocess`` is full.

    A step with no work of its own, in front of the decode, so the refusal comes before
    it (``embed_runtime/models/admit_image.py``); a quarter as many instances as the
    preprocessing step, at least one. ``peek``: ``<name>_admit_url``, the same in front
    of the URL fetch, passing URLs on and counting nothing.
    """
    config = python_model(
        name,
        entry.max_batch_size,
        [IOSpec("IMAGE", "TYPE_STRING", (1,))],
        [IOSpec(ADMITTED, "TYPE_STRING", (1,))],
        {
            **admission_parameters(entry, preprocess),
            **({ADMISSION_PEEK: "true"} if peek else {}),
        },
        step_batching(entry, 0, admitted=True),
        Instances(max(1, entry.preprocess_instances // 4)),
    )
    return ModelDir(name, config, "admit_image", {})


def _with_parameters(model_dir: ModelDir, parameters: dict[str, str]) -> ModelDir:
    """``model_dir`` whose config also carries ``parameters`` (read by clients, not steps)."""
    blocks = "".join(
        f'parameters {{\n  key: "{key}"\n  value {{ string_value: "{value}" }}\n}}\n'
        for key, value in sorted(parameters.items())
    )
    return dataclasses.replace(model_dir, config=model_dir.config + blocks)


def build(entry: ModelEntry, manifest: Manifest, work: Path) -> list[ModelDir]:
    """Export and validate both towers; describe the model dirs of one CLIP model."""
    if entry.image_decode == "gpu":  # refused before any export where it could never run
        require_cuda_device(f"{entry.name}: image_decode 'gpu'")
    model, _, tokenizer = _load(entry, manifest)
    context = int(getattr(tokenizer, "context_length", 0) or model.context_length)
    pre = preprocess_params_from_model(
        model,
        max_image_pixels=entry.max_image_pixels,
        max_batch_pixels=entry.max_batch_pixels,
        draft_decode=entry.image_draft_decode,
        image_decode=entry.image_decode,
        apply_exif=entry.image_apply_exif,
    )
    dim = embedding_dim(model, context, pre.size)
    tokenizer_json = work / "tokenizer.json"
    # Both checked against open_clip: the step cleans as open_clip does, then tokenizes.
    if is_hf_tokenizer(tokenizer):  # SigLIP, SigLIP2, XLM-R, ...
        tok_params = write_hf_tokenizer_json(tokenizer, tokenizer_json, context)
    else:
        tok_params = write_tokenizer_json(tokenizer, tokenizer_json, context)
    export_towers(model, work, context, pre.size, tokenizer, entry.graph_precision)

    n = entry.name
    text_spec, image_spec = text_graph_spec(context, dim), image_graph_spec(pre.size, dim)
    image_steps = [
        (f"{n}_preprocess_image", ["IMAGE"], ["pixel_values"]),
        (f"{n}_encode_image", ["pixel_values"], ["EMBEDDING"]),
    ]
    url_steps = [(FETCH_IMAGE, ["IMAGE_URL"], ["IMAGE"]), *image_steps]
    admit = []
    if admits(entry):  # a step in front of the decode refuses while it is full
        image_steps[0] = (f"{n}_preprocess_image", [("IMAGE", "admitted")], ["pixel_values"])
        image_steps.insert(0, (f"{n}_admit_image", ["IMAGE"], [(ADMITTED, "admitted")]))
        # and one in front of the fetch, while preprocessing is already full
        url_steps = [
            (f"{n}_admit_url", [("IMAGE", "IMAGE_URL")], [(ADMITTED, "url_admitted")]),
            (FETCH_IMAGE, [("IMAGE_URL", "url_admitted")], ["IMAGE"]),
            *image_steps,
        ]
        admit = [
            _admit_dir(entry, f"{n}_admit_image", f"{n}_preprocess_image"),
            _admit_dir(entry, f"{n}_admit_url", f"{n}_preprocess_image", peek=True),
        ]
    string = "TYPE_STRING"
    scores = score_parameters(model)  # the ensembles tell clients how open_clip scores pairs
    ensembles = [
        chain_dir(
            entry,
            f"{n}_text",
            IOSpec("TEXT", string, (1,)),
            dim,
            [
                (f"{n}_tokenize", ["TEXT"], ["input_ids"]),
                (f"{n}_encode_text", ["input_ids"], ["EMBEDDING"]),
            ],
        ),
        chain_dir(entry, f"{n}_image", IOSpec("IMAGE", string, (1,)), dim, image_steps),
        chain_dir(
            entry,
            f"{n}_image_url",
            IOSpec("IMAGE_URL", string, (1,)),
            dim,
            url_steps,
        ),
    ]
    return [
        tokenize_dir(
            entry, f"{n}_tokenize", tokenizer_json, tok_params, context, encoder=f"{n}_encode_text"
        ),
        encoder_dir(
            entry,
            f"{n}_encode_text",
            work / "text_encoder.onnx",
            text_spec,
            False,
            limits={"vocab_size": _vocab_size(model), "max_width": context},
        ),
        _preprocess_dir(
            entry, f"{n}_preprocess_image", pre.to_parameters(), pre.size, f"{n}_encode_image"
        ),
        encoder_dir(entry, f"{n}_encode_image", work / "image_encoder.onnx", image_spec, False),
        *admit,
        *(_with_parameters(d, scores) for d in ensembles),
    ]
