"""Triton Python model ``<name>_encode`` of an inference-free sparse encoder.

Takes ``TEXT`` and the request parameter ``task``: ``query`` rows are weighed by the
model's static token weights, ``document`` rows (the default) go through the SPLADE graph;
each request answers ``SPARSE_INDICES`` / ``SPARSE_VALUES``
(``embed_runtime.engines.sparse_router``).
"""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.encode_step import EncodeStep, open_sparse_router_engine


class TritonPythonModel(EncodeStep):
    """Routes every request of a dynamic batch and answers its active dimensions."""

    pb_utils = pb_utils
    opener = staticmethod(open_sparse_router_engine)
