"""Triton Python model ``<name>_tokenize``: one batched tokenizer call per ``execute``."""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.adapter import input_array
from embed_runtime.serving.tokenize_step import TokenizeStep
from embed_runtime.engines.output_precision import resolve_precision
from embed_runtime.text.request_options import request_parameters
from embed_runtime.text.tokenizer import (
    BatchTokenizer,
    decode_texts,
    keeps_end,
    prompted_texts,
)


class TritonPythonModel(TokenizeStep):
    """Turns ``TEXT`` rows into token tensors (one ragged row set per request)."""

    pb_utils = pb_utils

    def open_tokenizer(self, path, params):
        """A batch tokenizer of the file."""
        return BatchTokenizer(path, self.params)

    def _read(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        caps = self.params.max_text_bytes, self.params.max_request_bytes
        texts = decode_texts(rows, "TEXT", *caps)
        parameters = request_parameters(request.parameters())
        if self.params.float32_only:  # the encoder after this step answers float32 alone
            resolve_precision(parameters, ())
        texts = self.tokenizer.clean(prompted_texts(texts, parameters, self.params))
        self.tokenizer.refuse_overlong(texts, parameters)
        keep_end = keeps_end(parameters)
        return [(text, keep_end) for text in texts]

    def _encode(self, rows):
        texts, keep_end = zip(*rows, strict=True)
        return self.tokenizer.encode(texts, keep_end)
