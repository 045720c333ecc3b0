"""Triton Python model ``<name>_encode`` of an inference-free sparse encoder.

Takes ``TEXT`` and the request parameter ``task``: ``query`` rows are weighed by the
model's static token weights, ``document`` rows (the default) go through the SPLADE graph;
each request answers ``SPARSE_INDICES`` / ``SPARSE_VALUES`` (``embed_runtime.sparse_router``).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, embed_requests, input_array
from embed_runtime.fused_encoder import TextEncoder
from embed_runtime.ort_encoder import open_encoder
from embed_runtime.request_options import request_parameters
from embed_runtime.sparse import INDICES, VALUES
from embed_runtime.sparse_router import SparseRouter, query_tokenizer


class TritonPythonModel:
    """Routes every request of a dynamic batch and answers its active dimensions."""

    def initialize(self, args):
        """Build both routes once: the query tokenizer and weights, the SPLADE session."""
        self.logger = pb_utils.Logger
        raw = config_parameters(json.loads(args["model_config"]))
        opened = open_encoder(args, raw)
        encoder, model_dir = opened.encoder, opened.model_dir
        self.router = SparseRouter(
            TextEncoder.from_parameters(raw, model_dir, encoder),
            query_tokenizer(raw, model_dir),
            np.load(os.path.join(model_dir, raw["query_weights_file"])),
            opened.params.max_active_dims,
        )
        self.logger.log_info(
            f"{args['model_name']}: ONNX Runtime on {encoder.session.get_providers()}, "
            f"graph {encoder.model_path}; queries by static weights"
        )

    def _read(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        return self.router.read(rows, request_parameters(request.parameters()))

    def execute(self, requests):
        """Embed all valid requests, each route in one batched pass."""
        return embed_requests(
            pb_utils, requests, self._read, self.router.embed, [INDICES, VALUES],
            self.logger.log_error,
        )

    def finalize(self):
        """Release the tokenizers and the ONNX Runtime session."""
        self.router = None
