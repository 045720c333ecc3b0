"""Family ``sparse-encoder``: SPLADE sparse text embeddings (declaration; build: ``export``).

An entry ``<name>`` builds ``<name>_tokenize``, ``<name>_encode`` (the MLM transformer and
its SpladePooling in one ONNX graph; the stub answers each row's active dimensions) and
the ensemble ``<name>``: ``TEXT`` -> ``SPARSE_INDICES`` + ``SPARSE_VALUES``. An
inference-free one (a Router: static query weights, SPLADE documents) builds
``<name>_encode`` (``TEXT`` in, routed per request ``task``) and the ensemble.
"""

from __future__ import annotations

from ...declared_kind import Served
from ..text_family import text_family

FAMILY = text_family(
    "sparse-encoder",
    __name__,
    ("tokenize", "encode"),
    Served(
        types=("SparseEncoder",),
        modules=("Transformer", "MLMTransformer", "SpladePooling"),
        tasks=(None, "fill-mask"),
        # Inference-free: queries by static weights, documents by SPLADE (inference_free).
        routes=(
            (("document", ("Transformer", "SpladePooling")), ("query", ("SparseStaticEmbedding",))),
        ),
    ),
    python_ort_because="the Python encoder turns the dense rows into their active dimensions",
    own_options=("max_active_dims",),
)
