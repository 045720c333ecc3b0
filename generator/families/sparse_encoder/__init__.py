"""Family ``sparse-encoder``: SPLADE sparse text embeddings (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize``, ``<name>_encode`` (the MLM transformer and
its SpladePooling in one ONNX graph; the stub answers each row's active dimensions) and
the ensemble ``<name>``: ``TEXT`` -> ``SPARSE_INDICES`` + ``SPARSE_VALUES``. An
inference-free one (a Router: static query weights, SPLADE documents) builds
``<name>_encode`` (``TEXT`` in, routed per request ``task``) and the ensemble.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...declared_kind import Served
from ..sentence_transformers import check_sentence_transformers_folder, name_from_source
from ..spec import Errors, Family

if TYPE_CHECKING:
    from ...manifest import ModelEntry


def _steps(entry: ModelEntry) -> tuple[str, ...]:
    return ("tokenize", "encode")


def _check_entry(where: str, entry: ModelEntry, errors: Errors) -> None:
    if entry.encoder_backend != "python-ort":
        errors.append(
            f"{where}: sparse-encoder needs encoder_backend 'python-ort' (the Python encoder "
            "turns the dense rows into their active dimensions)"
        )


FAMILY = Family(
    name="sparse-encoder",
    package=__name__,
    steps=_steps,
    ensembles=("",),
    required=("source",),
    check_entry=_check_entry,
    check_folder=check_sentence_transformers_folder,
    default_name=name_from_source,
    served=Served(
        types=("SparseEncoder",),
        modules=("Transformer", "MLMTransformer", "SpladePooling"),
        tasks=(None, "fill-mask"),
        # Inference-free: queries by static weights, documents by SPLADE (inference_free).
        routes=(
            (("document", ("Transformer", "SpladePooling")), ("query", ("SparseStaticEmbedding",))),
        ),
    ),
    own_options=("max_active_dims",),
)
