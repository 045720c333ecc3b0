"""Triton Python model ``<name>_encode`` of a multi-vector (ColBERT) model.

Takes ``TEXT`` and the request parameter ``task`` (``query`` / ``document``), tokenizes
each task's rows as the model does (markers, query expansion), runs the token-level
ONNX graph over all rows of the execution sorted by width, and answers each row's
scored vectors: ``EMBEDDINGS`` ``[N, T, D]`` (zero-padded) and ``TOKEN_COUNT``
(``embed_runtime.multivector``).
"""

import json
import os

import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, embed_requests, input_array
from embed_runtime.multivector import (
    EMBEDDINGS,
    TOKEN_COUNT,
    MultiVectorParams,
    MultiVectorTextEncoder,
)
from embed_runtime.ort_encoder import open_encoder
from embed_runtime.request_options import request_parameters
from embed_runtime.tokenizer import TokenizerParams


class TritonPythonModel:
    """Embeds every request of a dynamic batch into per-token vectors."""

    def initialize(self, args):
        """Build the tokenizers and the ONNX Runtime session once."""
        self.logger = pb_utils.Logger
        raw = config_parameters(json.loads(args["model_config"]))
        opened = open_encoder(args, raw)
        encoder = opened.encoder
        self.text = MultiVectorTextEncoder(
            os.path.join(opened.model_dir, raw["tokenizer_file"]),
            TokenizerParams.from_parameters(raw),
            MultiVectorParams.from_parameters(raw),
            encoder,
        )
        self.logger.log_info(
            f"{args['model_name']}: ONNX Runtime on {encoder.session.get_providers()}, "
            f"graph {encoder.model_path}"
        )
        if encoder.cache_error:  # served all the same, the session with its own weights
            self.logger.log_warn(
                f"{args['model_name']}: weight cache not used: {encoder.cache_error}"
            )

    def _read(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        return self.text.read(rows, request_parameters(request.parameters()))

    def execute(self, requests):
        """Embed all valid requests in one sorted, chunked pass."""
        return embed_requests(
            pb_utils,
            requests,
            self._read,
            self.text.embed,
            [EMBEDDINGS, TOKEN_COUNT],
            self.logger.log_error,
        )

    def finalize(self):
        """Release the tokenizers and the ONNX Runtime session."""
        self.text = None
