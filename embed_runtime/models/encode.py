"""Triton Python model ``<name>_encode``: an ONNX encoder run with ONNX Runtime.

Token inputs arrive ragged (each request keeps its own width); all rows of one
``execute`` are sorted by true length and run in chunks padded to their own longest
row, then returned in request order. Fixed-shape inputs (pixels, CLIP's fixed text
context) are concatenated and run in chunks. With ``fused_tokenize`` the model takes
``TEXT`` and tokenizes it in this stub first; with ``sparse`` rows are answered as their
active dimensions. The config picks the engine once (``embed_runtime.serving.encode_step``).
"""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.encode_step import EncodeStep, open_graph_engine


class TritonPythonModel(EncodeStep):
    """Runs the encoder graph over every request of a dynamic batch."""

    pb_utils = pb_utils
    opener = staticmethod(open_graph_engine)
