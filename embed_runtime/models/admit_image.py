"""Triton Python model ``<name>_admit_image``: the first step of a CLIP model's image ensembles.

It does no work on an image: it passes ``IMAGE`` (the bytes of each image) on unchanged
as ``ADMITTED``, or refuses the request at once, HTTP 503 / gRPC ``UNAVAILABLE`` "server
overloaded", while the preprocessing step after it (``<name>_preprocess_image``) has more
than ``admission_wait_us`` of work queued (``embed_runtime.ops.backlog_board``). Image
decode is the costly work to refuse before; it runs in the preprocessing step, which
cannot see its own queue, so this cheap step in front counts what it passes on and the
preprocessing instances count what they take. No Triton queue policy is needed on either
step, so both keep the batcher's prefetching (docs/architecture.md, "Under load").

The same code serves ``<name>_admit_url``, the first step of the URL ensemble, with
``admission_peek`` set: it passes each request's URLs on to ``fetch_image``, or refuses
the request before its fetch while preprocessing is already full, and counts nothing. A
URL may fail to fetch and never reach preprocessing, so only the ``<name>_admit_image``
after the fetch counts what it passes on; the one before it only spares the fetch of a
request that would be refused anyway.
"""

import numpy as np
import triton_python_backend_utils as pb_utils
from embed_runtime.errors import InvalidInputError
from embed_runtime.ops.server_exit import exit_with_server
from embed_runtime.serving.adapter import (
    config_parameters,
    gather_rows,
    input_array,
    with_tickets,
)
from embed_runtime.serving.admission import ADMISSION_PEEK, AdmissionGate

OUTPUT = "ADMITTED"


def _images(request):
    """The request's images, one item a row (bytes objects)."""
    images = input_array(pb_utils, request, "IMAGE")
    if images.size == 0:
        raise InvalidInputError("IMAGE has zero rows")
    return list(images.reshape(-1))


def _column(images):
    column = np.empty((len(images), 1), dtype=np.object_)
    column[:, 0] = images
    return column


class TritonPythonModel:
    """Admits image requests to the preprocessing step, or refuses them before any work."""

    def initialize(self, args):
        """Open this instance's slot on the preprocessing step's backlog board."""
        exit_with_server()
        params = config_parameters(args["model_config"])
        self.gate = AdmissionGate.from_parameters(
            params, args["model_version"], pb_utils, args["model_name"]
        )
        self.counts = params.get(ADMISSION_PEEK) != "true"

    def execute(self, requests):
        """Each request's images passed on as they are, or its refusal."""
        batch = gather_rows(pb_utils, requests, _images, self.gate)
        outputs = {
            i: [pb_utils.Tensor(OUTPUT, _column(batch.items[start:stop]))]
            for i, start, stop in batch.slices()
        }
        if self.counts:
            outputs = with_tickets(pb_utils, self.gate, batch, outputs)
        for i, tensors in outputs.items():
            batch.responses[i] = pb_utils.InferenceResponse(tensors)
        return batch.responses

    def finalize(self):
        """Free this instance's admission slot."""
        if self.gate is not None:
            self.gate.close()
