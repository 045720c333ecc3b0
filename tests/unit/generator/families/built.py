"""What a family's build wrote, read back the way the served steps read it.

Shared by the families' unit tests: the config parameters of a rendered step, the tiny
sentence-transformers folders of ``tests/st_factory.py`` exported with sentence-transformers'
own answers beside them (:class:`ExportedVariant`), and rerankers exported and loaded as
the served tokenizer and encoder load them (:class:`ExportedReranker`).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort

from embed_runtime.engines.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.text.pair_template import TemplatePairTokenizer
from embed_runtime.text.pair_tokenizer import PairTokenizer, open_pair_tokenizer
from embed_runtime.text.tokenizer import BatchTokenizer, TokenizerParams
from generator.families.cross_encoder import export as cross_encoder
from generator.families.sentence_transformers import export as sentence_transformers
from generator.manifest import Manifest, ModelEntry
from generator.model_dir import ModelDir
from generator.render import parse_config
from tests.st_factory import load_reference, manifest_entry, reference_embeddings


def config_parameters(config: str) -> dict[str, str]:
    """The parameters of a rendered ``config.pbtxt``, as the python models read them."""
    return {k: v.string_value for k, v in parse_config(config).parameters.items()}


def build_variant(variant, folder: Path, work: Path, **fields) -> dict[str, ModelDir]:
    """The sentence-transformers family's build of ``variant``'s saved ``folder`` (manifest
    ``fields`` added) into ``work``: its model directories by name."""
    entry = ModelEntry(**manifest_entry(variant, folder, **fields))
    work.mkdir(parents=True)
    manifest = Manifest(models=(entry,), base_dir=folder.parent)
    return {d.name: d for d in sentence_transformers.build(entry, manifest, work)}


@dataclasses.dataclass(frozen=True)
class ExportedVariant:
    """A tiny model exported by :func:`build_variant`, and sentence-transformers' own
    embeddings of ``texts`` (``expected``) from an independent load of its folder."""

    variant: object
    folder: Path
    work: Path
    configs: dict[str, str]
    reference: object
    texts: list[str]
    expected: np.ndarray

    @property
    def encode_config(self) -> str:
        return self.configs[f"{self.variant.name}_encode"]

    @property
    def tokenize_params(self) -> dict[str, str]:
        return config_parameters(self.configs[f"{self.variant.name}_tokenize"])

    @property
    def encode_params(self) -> dict[str, str]:
        return config_parameters(self.encode_config)

    @functools.cached_property
    def session(self) -> ort.InferenceSession:
        """The exported graph in onnxruntime."""
        return ort.InferenceSession(str(self.work / "model.onnx"))

    def tokenizer(self) -> BatchTokenizer:
        """The served tokenizer, built from the tokenize step's parameters."""
        params = TokenizerParams.from_parameters(self.tokenize_params)
        return BatchTokenizer(str(self.work / "tokenizer.json"), params)

    def serving_encoder(self) -> OrtEncoder:
        """The served encoder, built from the encode step's parameters, but run in chunks
        of 3 rows (so a batch takes several)."""
        params = EncoderParams.from_parameters(self.encode_params)
        encoder_params = dataclasses.replace(params, max_rows_per_run=3)
        return OrtEncoder(str(self.work / "model.onnx"), encoder_params)

    def served(self, encoder: OrtEncoder) -> np.ndarray:
        """``texts`` down the served path without Triton: the runtime tokenizer, requests
        of 5 texts, merged (ragged) and run by ``encoder`` in length-sorted chunks."""
        tokenizer, texts = self.tokenizer(), self.texts
        requests = [tokenizer.encode(texts[i : i + 5]) for i in range(0, len(texts), 5)]
        return np.concatenate(encoder.encode_tokens(requests))


def export_variant(
    variant, folder: Path, work: Path, texts: list[str], **fields
) -> ExportedVariant:
    """:func:`build_variant`, then sentence-transformers' embeddings of ``texts``."""
    configs = {name: d.config for name, d in build_variant(variant, folder, work, **fields).items()}
    reference = load_reference(folder)
    expected = reference_embeddings(reference, variant, texts)
    return ExportedVariant(variant, folder, work, configs, reference, texts, expected)


def build_reranker(folder: Path, work: Path, name: str) -> dict[str, ModelDir]:
    """The cross-encoder family's build of ``folder`` as model ``name``: its model dirs."""
    entry = ModelEntry(name=name, family="cross-encoder", source=str(folder))
    return {d.name: d for d in cross_encoder.build(entry, Manifest(models=(entry,)), work)}


@dataclasses.dataclass(frozen=True)
class ExportedReranker:
    """A reranker exported by :func:`build_reranker`, its tokenizer and encoder loaded as the
    served steps load them, and ``CrossEncoder``'s own load of the folder."""

    folder: Path
    tokenize_params: TokenizerParams
    tokenizer: PairTokenizer | TemplatePairTokenizer
    encoder: OrtEncoder
    reference: object


def export_reranker(folder: Path, work: Path, name: str) -> ExportedReranker:
    """:func:`build_reranker`; asserts its three steps and that the encoder answers SCORE."""
    from sentence_transformers import CrossEncoder

    dirs = build_reranker(folder, work, name)
    assert set(dirs) == {name, f"{name}_tokenize", f"{name}_encode"}
    raw = config_parameters(dirs[f"{name}_tokenize"].config)
    tok_params = TokenizerParams.from_parameters(raw)
    enc_params = EncoderParams.from_parameters(config_parameters(dirs[f"{name}_encode"].config))
    assert enc_params.output_name == "SCORE"
    return ExportedReranker(
        folder=folder,
        tokenize_params=tok_params,
        tokenizer=open_pair_tokenizer(str(work / "tokenizer.json"), tok_params, raw),
        encoder=OrtEncoder(str(work / "model.onnx"), enc_params),
        reference=CrossEncoder(str(folder), device="cpu"),
    )
