"""Triton Python model ``<name>_tokenize``: one batched tokenizer call per ``execute``."""

import os

import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import (
    config_parameters,
    error_response,
    gather_rows,
    input_array,
    run_or_isolate,
)
from embed_runtime.request_options import request_parameters
from embed_runtime.text import (
    BatchTokenizer,
    TokenizerParams,
    decode_texts,
    prompted_texts,
    split_rows,
)


class TritonPythonModel:
    """Turns ``TEXT`` rows into token tensors (one ragged row set per request)."""

    def initialize(self, args):
        """Build the tokenizer once from the model's config parameters."""
        self.logger = pb_utils.Logger
        params = config_parameters(args["model_config"])
        self.params = TokenizerParams.from_parameters(params)
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = BatchTokenizer(
            os.path.join(model_dir, params["tokenizer_file"]), self.params
        )

    def _read(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        caps = self.params.max_text_bytes, self.params.max_request_bytes
        texts = decode_texts(rows, "TEXT", *caps)
        return prompted_texts(texts, request_parameters(request.parameters()), self.params)

    def _tokenize(self, groups):
        texts = [text for group in groups for text in group]
        return split_rows(self.tokenizer.encode(texts), [len(g) for g in groups])

    def execute(self, requests):
        """Validate every request, tokenize all valid rows at once, slice back."""
        batch = gather_rows(pb_utils, requests, self._read)
        if not batch.items:
            return batch.responses
        groups = [batch.items[start:stop] for _, start, stop in batch.slices()]
        parts = run_or_isolate(self._tokenize, groups, self.logger.log_error)
        for i, arrays in zip(batch.valid, parts, strict=True):
            if isinstance(arrays, Exception):
                batch.responses[i] = error_response(pb_utils, arrays, self.logger.log_error)
                continue
            tensors = [pb_utils.Tensor(n, arrays[n]) for n in self.params.output_names]
            batch.responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
        return batch.responses

    def finalize(self):
        """Drop the tokenizer."""
        self.tokenizer = None
