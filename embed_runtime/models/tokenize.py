"""Triton Python model ``<name>_tokenize``: one batched tokenizer call per ``execute``."""

import os

import triton_python_backend_utils as pb_utils
from embed_runtime.ops.integrity import verify_digests
from embed_runtime.serving.adapter import config_parameters, input_array, tokenize_requests
from embed_runtime.engines.output_precision import resolve_precision
from embed_runtime.text.request_options import request_parameters
from embed_runtime.text.tokenizer import (
    BatchTokenizer,
    TokenizerParams,
    decode_texts,
    keeps_end,
    prompted_texts,
)


class TritonPythonModel:
    """Turns ``TEXT`` rows into token tensors (one ragged row set per request)."""

    def initialize(self, args):
        """Build the tokenizer once from the model's config parameters."""
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = TokenizerParams.from_parameters(params)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)  # a corrupt tokenizer file fails the load
        self.tokenizer = BatchTokenizer(
            os.path.join(model_dir, params["tokenizer_file"]), self.params
        )

    def _read(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        caps = self.params.max_text_bytes, self.params.max_request_bytes
        texts = decode_texts(rows, "TEXT", *caps)
        parameters = request_parameters(request.parameters())
        if self.params.float32_only:  # the encoder after this step answers float32 alone
            resolve_precision(parameters, ())
        texts = prompted_texts(texts, parameters, self.params)
        self.tokenizer.refuse_overlong(texts, parameters)
        keep_end = keeps_end(parameters)
        return [(text, keep_end) for text in texts]

    def _encode(self, rows):
        texts, keep_end = zip(*rows, strict=True)
        return self.tokenizer.encode(texts, keep_end)

    def execute(self, requests):
        """Validate every request, tokenize all valid rows at once, slice back."""
        return tokenize_requests(
            pb_utils,
            requests,
            self._read,
            self._encode,
            self.params.output_names,
            self.logger.log_error,
        )

    def finalize(self):
        """Drop the tokenizer."""
        self.tokenizer = None
