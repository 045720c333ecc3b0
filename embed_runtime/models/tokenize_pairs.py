"""Triton Python model ``<name>_tokenize`` of a reranker: (QUERY, TEXT) pairs -> tokens."""

import triton_python_backend_utils as pb_utils
from embed_runtime.serving.adapter import input_array
from embed_runtime.serving.tokenize_step import TokenizeStep
from embed_runtime.text.chunking import refuse_chunk_options
from embed_runtime.text.request_options import request_parameters
from embed_runtime.text.pair_tokenizer import decode_pairs, open_pair_tokenizer


class TritonPythonModel(TokenizeStep):
    """Turns ``QUERY``/``TEXT`` row pairs into token tensors (ragged per request)."""

    pb_utils = pb_utils

    def open_tokenizer(self, path, params):
        """The pair tokenizer of the file (its template from ``params``)."""
        return open_pair_tokenizer(path, self.params, params)

    def _read(self, request):
        queries = input_array(pb_utils, request, "QUERY")
        texts = input_array(pb_utils, request, "TEXT")
        pairs = decode_pairs(queries, texts, self.params)
        parameters = request_parameters(request.parameters())
        refuse_chunk_options(parameters, "")  # a reranker scores pairs whole
        return self.tokenizer.prepare(pairs, parameters)

    def _encode(self, rows):
        return self.tokenizer.encode(rows)
