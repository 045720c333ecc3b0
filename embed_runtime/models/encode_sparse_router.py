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
from embed_runtime.integrity import verify_digests
from embed_runtime.ort_encoder import EncoderParams, OrtEncoder
from embed_runtime.request_options import request_parameters
from embed_runtime.sparse import INDICES, VALUES
from embed_runtime.sparse_router import SparseRouter, query_tokenizer


class TritonPythonModel:
    """Routes every request of a dynamic batch and answers its active dimensions."""

    def initialize(self, args):
        """Build both routes once: the query tokenizer and weights, the SPLADE session."""
        self.logger = pb_utils.Logger
        raw = config_parameters(json.loads(args["model_config"]))
        params = EncoderParams.from_parameters(raw)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)  # a corrupt model file fails the load, never an answer
        device_id = int(args.get("model_instance_device_id") or 0)
        encoder = OrtEncoder(os.path.join(model_dir, params.onnx_file), params, device_id)
        self.router = SparseRouter(
            TextEncoder.from_parameters(raw, model_dir, encoder),
            query_tokenizer(raw, model_dir),
            np.load(os.path.join(model_dir, raw["query_weights_file"])),
            params.max_active_dims,
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
