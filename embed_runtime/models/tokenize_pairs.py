"""Triton Python model ``<name>_tokenize`` of a reranker: (QUERY, TEXT) pairs -> tokens."""

import os

import triton_python_backend_utils as pb_utils
from embed_runtime.ops.integrity import verify_digests
from embed_runtime.serving.adapter import config_parameters, input_array, tokenize_requests
from embed_runtime.text.request_options import request_parameters
from embed_runtime.text.pair_tokenizer import decode_pairs, open_pair_tokenizer
from embed_runtime.text.tokenizer import TokenizerParams


class TritonPythonModel:
    """Turns ``QUERY``/``TEXT`` row pairs into token tensors (ragged per request)."""

    def initialize(self, args):
        """Build the pair tokenizer once from the model's config parameters."""
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = TokenizerParams.from_parameters(params)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)  # a corrupt tokenizer file fails the load
        self.tokenizer = open_pair_tokenizer(
            os.path.join(model_dir, params["tokenizer_file"]), self.params, params
        )

    def _read(self, request):
        queries = input_array(pb_utils, request, "QUERY")
        texts = input_array(pb_utils, request, "TEXT")
        pairs = decode_pairs(queries, texts, self.params)
        return self.tokenizer.prepare(pairs, request_parameters(request.parameters()))

    def execute(self, requests):
        """Validate every request, tokenize all valid pairs at once, slice back."""
        return tokenize_requests(
            pb_utils,
            requests,
            self._read,
            self.tokenizer.encode,
            self.params.output_names,
            self.logger.log_error,
        )

    def finalize(self):
        """Drop the tokenizer."""
        self.tokenizer = None
