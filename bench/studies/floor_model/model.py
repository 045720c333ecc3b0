"""The serving floor: a Python model that reads ``TEXT`` and returns zeros (bench.studies.floor).

It has the shipped encoder's config (batching, instances, output) and does none of its
work, so a request's time through it is what Triton, the ensemble, the Python backend's
shared-memory round trip, the protocol and the client cost before any tokenizing or
ONNX Runtime run.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Zeros of the encoder's width for every row of every request."""

    def initialize(self, args):
        """Read the embedding width from the copied encoder config."""
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self.width = int(parameters.get("max_dimensions", {}).get("string_value", "384"))
        self.counts = any(o["name"] == "TOKEN_COUNT" for o in config.get("output", []))

    def execute(self, requests):
        """One response per request, read as the encoder reads it."""
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            zeros = np.zeros((len(rows), self.width), dtype=np.float32)
            tensors = [pb_utils.Tensor("EMBEDDING", zeros)]
            if self.counts:  # the encoder's second output, when its config has it
                counts = np.zeros((len(rows), 1), dtype=np.int32)
                tensors.append(pb_utils.Tensor("TOKEN_COUNT", counts))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
