"""PyLate ColBERT folders: their pipeline rebuilt from sentence-transformers' own modules.

A folder saved by PyLate (``pylate.models.ColBERT.save``) holds a sentence-transformers
``Transformer``, one or more ``pylate.models.Dense`` projections (a sentence-transformers
``Dense`` on the token embeddings, the same config and weights) and, in
``config_sentence_transformers.json``, what ``ColBERT.encode`` does around them:

- a marker token (``query_prefix`` / ``document_prefix``, by default ``[Q] `` / ``[D] ``,
  added to the tokenizer when PyLate first built the model) inserted after ``[CLS]``,
  the text cut at ``query_length - 1`` / ``document_length - 1`` tokens first;
- queries padded to ``query_length`` with ``[MASK]`` (``do_query_expansion``), attended
  to only with ``attend_to_expansion_tokens``, every query position scored;
- documents without the tokens of ``skiplist_words`` (each word looked up as one token,
  an unknown word as ``[UNK]``, as PyLate does) and without padding;
- every vector L2-normalised (``normalize_embeddings=True``, the default).

That is served by the multi-vector stub with these settings and a graph of Transformer,
projections and Normalize. The build's parity gate compares the served rows with
PyLate's own ``encode`` (``generator.pylate_reference``), never with this rebuild; what
this module does not reproduce (prompts, other modules, an activation outside torch's
own) is refused by name.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np

from embed_runtime.engines.multivector import MultiVectorParams, TaskParams, insert_prefix

from ...declared_kind import UnsupportedModelError

TRANSFORMER_TYPES = ("sentence_transformers.models.Transformer",
                     "sentence_transformers.base.modules.Transformer")
DENSE_TYPE = "pylate.models.Dense.Dense"
# PyLate's defaults for keys a folder does not set (ColBERT.__init__, PyLate 1.6).
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
            "document_length": 180, "do_query_expansion": True,
            "attend_to_expansion_tokens": False}
ACTIVATIONS = ("torch.nn.modules.linear.Identity", "torch.nn.modules.activation.")
TOKEN_EMBEDDINGS = "token_embeddings"  # noqa: S105 - a tensor name


class PyLateModel:
    """The rebuilt pipeline: ``model[i]``, iteration, ``tokenizer``, ``max_seq_length``."""

    def __init__(self, modules: list, settings: dict):
        self.modules = modules
        self.settings = settings
        self.tokenizer = modules[0].tokenizer
        self.max_seq_length = max(int(settings["query_length"]),
                                  int(settings["document_length"]))

    def __getitem__(self, index: int):
        return self.modules[index]

    def __iter__(self):
        return iter(self.modules)


def _refuse(name: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{name}: PyLate ColBERT folder not supported by family 'multi-vector' ({why}); it "
        "serves a Transformer followed by pylate Dense projections, with PyLate's markers, "
        "query expansion and skiplist"
    )


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def settings_of(folder: Path, name: str) -> dict:
    """The folder's ``ColBERT`` settings, PyLate's defaults for the keys it does not set."""
    config = _json(folder / "config_sentence_transformers.json")
    prompts = {k: v for k, v in (config.get("prompts") or {}).items() if v}
    if prompts or config.get("default_prompt_name"):
        raise _refuse(name, f"prompts {prompts or config.get('default_prompt_name')!r}")
    settings = {k: config.get(k) if config.get(k) is not None else v for k, v in DEFAULTS.items()}
    settings["skiplist_words"] = config.get("skiplist_words")
    if settings["skiplist_words"] is None:
        import string  # noqa: PLC0415

        settings["skiplist_words"] = list(string.punctuation)
    for key in ("query_length", "document_length"):
        if not isinstance(settings[key], int) or settings[key] < 3:
            raise _refuse(name, f"{key} {settings[key]!r}")
    return settings


def _activation(name: str, dotted: str):
    if not (dotted == ACTIVATIONS[0] or dotted.startswith(ACTIVATIONS[1])):
        raise _refuse(name, f"Dense activation {dotted!r}")
    module, cls = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)()


def load(folder: str, name: str, max_seq_length: int | None = None) -> PyLateModel:
    """Rebuild the folder's pipeline with sentence-transformers' own modules."""
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415
    from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: PLC0415

    root = Path(folder)
    modules_json = json.loads((root / "modules.json").read_text(encoding="utf-8"))
    types = [m["type"] for m in modules_json]
    if len(types) < 2 or types[0] not in TRANSFORMER_TYPES or any(
            t != DENSE_TYPE for t in types[1:]):
        raise _refuse(name, f"modules {', '.join(types)}")
    if max_seq_length:
        raise _refuse(name, "a manifest max_seq_length (PyLate cuts at query_length / "
                            "document_length)")
    settings = settings_of(root, name)
    bert = _json(root / modules_json[0].get("path", "") / "sentence_bert_config.json")
    transformer = Transformer(
        str(root / modules_json[0].get("path", "")),
        model_kwargs={"attn_implementation": "eager"},
        max_seq_length=bert.get("max_seq_length"),
        do_lower_case=bool(bert.get("do_lower_case", False)),
    )
    modules: list = [transformer]
    for spec in modules_json[1:]:
        path = root / spec["path"]
        config = _json(path / "config.json")
        dense = Dense(
            int(config["in_features"]), int(config["out_features"]),
            bias=bool(config.get("bias", True)),
            activation_function=_activation(name, config.get("activation_function", "")),
            module_input_name=TOKEN_EMBEDDINGS, use_residual=bool(config.get("use_residual")),
        )
        if (path / "model.safetensors").is_file():
            state = load_file(str(path / "model.safetensors"))
        else:
            state = torch.load(path / "pytorch_model.bin", map_location="cpu",
                               weights_only=True)
        dense.load_state_dict(state)
        modules.append(dense)
    modules.append(Normalize(module_input_name=TOKEN_EMBEDDINGS))
    for module in modules:
        module.eval()
    return PyLateModel(modules, settings)


def _token_id(tokenizer, token: str) -> int:
    return int(tokenizer.convert_tokens_to_ids(token))


def params(model: PyLateModel) -> MultiVectorParams:
    """What the stub applies per task (module doc)."""
    tokenizer, settings = model.tokenizer, model.settings
    expansion_id = tokenizer.mask_token_id
    if expansion_id is None:
        expansion_id = tokenizer.eos_token_id
    if expansion_id is None:
        expansion_id = tokenizer.pad_token_id or 0
    prefixes = {
        task: _token_id(tokenizer, settings[f"{task}_prefix"]) if settings[f"{task}_prefix"]
        else -1
        for task in ("query", "document")
    }
    query_length = int(settings["query_length"])
    expand = bool(settings["do_query_expansion"])
    query = TaskParams(
        max_length=query_length,
        expansion_length=query_length if expand else 0,
        expansion_id=int(expansion_id) if expand else 0,
        expansion_attend=bool(settings["attend_to_expansion_tokens"]) and expand,
        prefix_id=prefixes["query"],
    )
    skip = tuple(_token_id(tokenizer, w) for w in settings["skiplist_words"])
    document = TaskParams(
        max_length=int(settings["document_length"]),
        skip_ids=tuple(sorted(set(skip))),
        prefix_id=prefixes["document"],
    )
    return MultiVectorParams(query, document)


def features(model: PyLateModel, texts, task: str, input_names: list[str]) -> dict:
    """Token tensors for ``texts`` as ``task``, the served way (export samples)."""
    task_params = params(model).task(task)
    encoded = model.tokenizer(
        list(texts), padding=True, truncation=True, max_length=task_params.text_length,
        return_tensors="np",
    )
    arrays = {n: np.asarray(encoded[n], dtype=np.int64) for n in input_names}
    if task_params.prefix_id >= 0:
        arrays = insert_prefix(arrays, task_params.prefix_id)
    return arrays
