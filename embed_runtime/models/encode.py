"""Triton Python model ``<name>_encode*``: an ONNX encoder run with ONNX Runtime.

Token inputs arrive ragged (each request keeps its own width); all rows of one
``execute`` are sorted by true length and run in chunks padded to their own longest
row, then returned in request order. Fixed-shape inputs (pixels, CLIP's fixed text
context) are concatenated and run in chunks. With ``fused_tokenize`` the model takes
``TEXT`` and tokenizes it in this stub first (``embed_runtime.fused_encoder``).
"""

import dataclasses
import json
import os

import triton_python_backend_utils as pb_utils
from embed_runtime.adapter import config_parameters, embed_requests, input_array
from embed_runtime.busy_board import BusyBoard, board_path
from embed_runtime.integrity import verify_digests
from embed_runtime.ort_encoder import (
    EncoderParams,
    OrtEncoder,
    available_cores,
    check_request,
    shared_threads,
)
from embed_runtime.request_options import request_parameters, resolve_dimensions, truncate
from embed_runtime.fused_encoder import COUNT_OUTPUT, TextEncoder, is_fused, token_counts
from embed_runtime.output_precision import OutputForms
from embed_runtime.sparse import INDICES, VALUES, request_max_active_dims, sparse_rows


class TritonPythonModel:
    """Runs the encoder graph over every request of a dynamic batch."""

    def initialize(self, args):
        """Build the ONNX Runtime session once."""
        self.logger = pb_utils.Logger
        config = json.loads(args["model_config"])
        raw = config_parameters(config)
        params = EncoderParams.from_parameters(raw)
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", []))
        board = None
        if params.shared_intra_op_threads and instances > 1:
            shared = shared_threads(params.shared_intra_op_threads, instances, available_cores())
            params = dataclasses.replace(params, shared_intra_op_threads=shared)
            if shared != params.intra_op_threads:  # else one session serves both cases
                board = BusyBoard(board_path(args["model_name"], args["model_version"]))
        self.params = params
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        verify_digests(model_dir)  # a corrupt model file fails the load, never an answer
        device_id = int(args.get("model_instance_device_id") or 0)
        path = os.path.join(model_dir, self.params.onnx_file)
        self.encoder = OrtEncoder(path, self.params, device_id, board)
        self.text = None
        if is_fused(raw):  # TEXT in: this stub does the tokenizer step's work too
            self.text = TextEncoder.from_parameters(raw, model_dir, self.encoder)
        # TOKEN_COUNT, when the config declares it: each row's tokens (its attention mask)
        output_names = [o["name"] for o in config.get("output", [])]
        self.counts = COUNT_OUTPUT in output_names
        # EMBEDDING_FP16 / _INT8 / ... when declared: quantized forms, per request
        self.forms = OutputForms.from_config(output_names, model_dir, self.params.normalize)
        providers = self.encoder.session.get_providers()
        threads = self.params.intra_op_threads or "default"
        if self.encoder.shared_session is not None:
            threads = f"{threads} alone, {self.params.shared_intra_op_threads} beside another"
        self.logger.log_info(
            f"{args['model_name']}: ONNX Runtime on {providers}, intra-op threads {threads}, "
            f"graph {self.encoder.model_path}"
        )
        for repair in self.encoder.cache_repairs:
            self.logger.log_warn(f"{args['model_name']}: {repair}")
        if self.encoder.cache_error:  # served all the same, each session with its own weights
            self.logger.log_warn(
                f"{args['model_name']}: weight cache not used: {self.encoder.cache_error}"
            )

    def _forms(self, request, parameters):
        """The extra forms (float16, int8, ...) this request gets; refuses a bad precision."""
        return self.forms.select(parameters, request.requested_output_names())

    def _read(self, request):
        arrays = {n: input_array(pb_utils, request, n) for n in self.params.input_names}
        check_request(self.params, arrays)
        parameters = request_parameters(request.parameters())
        full, default = self.params.max_dimensions, self.params.default_dimensions
        dims = resolve_dimensions(parameters, full, default)
        if self.params.sparse:  # the cap on active dimensions, in place of a width
            dims = request_max_active_dims(parameters, self.params.max_active_dims)
        inputs = arrays if self.params.ragged else arrays[self.params.input_names[0]]
        return inputs, dims, self._forms(request, parameters)

    def _read_text(self, request):
        rows = input_array(pb_utils, request, "TEXT")
        parameters = request_parameters(request.parameters())
        return self.text.read(rows, parameters), self._forms(request, parameters)

    def _answer(self, embeddings, counts, forms):
        """One request's outputs: EMBEDDING, TOKEN_COUNT if declared, the forms it gets."""
        out = {self.params.output_name: embeddings}
        if self.counts:
            out[COUNT_OUTPUT] = counts
        return {**out, **self.forms.outputs(embeddings, forms)}

    def _run(self, items):
        run = self.encoder.encode_tokens if self.params.ragged else self.encoder.encode_dense
        outputs = run([inputs for inputs, _, _ in items])
        if self.params.sparse:  # each request its own width K
            return [sparse_rows(o, k) for o, (_, k, _) in zip(outputs, items, strict=True)]
        answers = []
        for rows, (inputs, k, forms) in zip(outputs, items, strict=True):
            rows = truncate(rows, k, self.params.normalize) if k else rows
            counts = token_counts(inputs["attention_mask"]) if self.counts else None
            answers.append(self._answer(rows, counts, forms))
        return answers

    def _run_text(self, items):
        out = self.text.embed([text for text, _ in items])
        pairs = zip(out, items, strict=True)
        return [self._answer(rows, counts, forms) for (rows, counts), (_, forms) in pairs]

    def execute(self, requests):
        """Embed all valid requests in one sorted, chunked pass."""
        if self.text:
            read, run = self._read_text, self._run_text
        else:
            read, run = self._read, self._run
        if self.params.sparse:
            names = [INDICES, VALUES]
        else:
            names = [self.params.output_name, *([COUNT_OUTPUT] if self.counts else [])]
        return embed_requests(pb_utils, requests, read, run, names, self.logger.log_error)

    def finalize(self):
        """Release the ONNX Runtime session(s) and this instance's busy-board slot."""
        if self.encoder is not None and self.encoder.board is not None:
            self.encoder.board.close()
        self.encoder = self.text = None
