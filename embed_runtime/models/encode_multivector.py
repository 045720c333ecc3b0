"""Triton Python model ``<name>_encode`` of a multi-vector (ColBERT) model.

Takes ``TEXT`` and the request parameter ``task`` (``query`` / ``document``), tokenizes
each task's rows as the model does (markers, query expansion), runs the token-level
ONNX graph over all rows of the execution sorted by width, and answers each row's
scored vectors: ``EMBEDDINGS`` ``[N, T, D]`` (zero-padded) and ``TOKEN_COUNT``
(``embed_runtime.engines.multivector``).
"""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.encode_step import EncodeStep, open_multivector_engine


class TritonPythonModel(EncodeStep):
    """Embeds every request of a dynamic batch into per-token vectors."""

    pb_utils = pb_utils
    opener = staticmethod(open_multivector_engine)
