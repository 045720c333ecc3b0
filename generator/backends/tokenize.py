"""Triton Python model ``<name>_tokenize``: one batched tokenizer call per ``execute``."""

import os
import traceback

import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, gather_rows, input_array
from embed_runtime.text import BatchTokenizer, TokenizerParams, decode_texts, split_rows


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

    def execute(self, requests):
        """Validate every request, tokenize all valid rows at once, slice back."""
        batch = gather_rows(
            pb_utils, requests, lambda r: decode_texts(input_array(pb_utils, r, "TEXT"))
        )
        if not batch.items:
            return batch.responses
        try:
            parts = split_rows(self.tokenizer.encode(batch.items), batch.counts)
        except Exception as exc:  # noqa: BLE001 - every request must get a response
            self.logger.log_error(traceback.format_exc())
            return batch.fail_valid(pb_utils, exc, self.logger.log_error)
        for i, arrays in zip(batch.valid, parts, strict=True):
            tensors = [pb_utils.Tensor(n, arrays[n]) for n in self.params.output_names]
            batch.responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
        return batch.responses

    def finalize(self):
        """Drop the tokenizer."""
        self.tokenizer = None
