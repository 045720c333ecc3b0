"""Triton Python model ``<name>_chunks``: long texts cut into chunks, each embedded whole.

The body is ``embed_runtime.serving.chunks_step``; the chunks are embedded by the model's
own ensemble ``<name>`` (business logic scripting), so they batch with its traffic.
"""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.chunks_step import ChunksStep


class TritonPythonModel(ChunksStep):
    """Cuts ``TEXT`` rows into chunks and answers one embedding per chunk."""

    pb_utils = pb_utils
