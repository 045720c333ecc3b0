"""Serving defaults per device: what an entry gets for a knob its manifest entry leaves out.

A bare entry (``name``, ``family``, ``source``) is served with the settings that measured
best on its ``device``, so ``models.toml``, ``deploy/models.cpu.toml``, ``deploy/models.toml``,
``generator add`` and runtime loads all take them from here instead of copying them by hand.
A key the entry sets always wins. ``python -m generator defaults`` prints the tables.

Where each figure comes from (docs/benchmarks.md):

- CPU, text: all-MiniLM-L6-v2 on a 2-core host. No queue delay (a lone request runs at
  once; the batcher still gathers what waits while an execution runs), length-sorted
  chunks of up to 64 rows cut where padding would pass 10 % of the tokens, two encoder
  processes (one runs while the other reads and writes; the one running alone uses every
  core), ONNX Runtime workers that stop spinning 20 us after a run, the tokenizer in the
  encoder's own stub (one Python step). ``make bench``'s bare-vs-tuned table checks it.
- CPU, images: the tiny CLIP's image tower, two encoder processes, the same thread policy.
- GPU: an H100 with 16 CPU cores. One-sentence requests are bound by the Python work per
  request until the GPU is busy: 8 encoder and 8 tokenizer instances served 10,552-11,094
  QPS for an e5-small-sized model; the CLIP text tower 9,270 QPS with 4 encoder instances;
  image decode + resize on the CPU bounds images (12 preprocessing instances).

Every profile bounds the work waiting for an encoder the way Triton's and TEI's users
expect (embed_runtime/serving/admission.py): a request that states no deadline is queued
and answered, up to ``admission_max_rows`` rows waiting (what the queue may hold in
memory: text rows of up to the model's window in int64 tokens, images of up to the fetch
cap) and ``admission_wait_us`` of estimated work (the longest wait a plain client is
asked to sit through); past either, the step in front of the encoder (tokenize, image
admit) refuses it at once, HTTP 503 / gRPC UNAVAILABLE "server overloaded". A request
that states a deadline (``deadline_unix_us``, or Triton's ``timeout`` parameter) is
refused at once when the estimated wait exceeds what is left of it. So ``fused_tokenize``
is off (one more Python step, 1-4 % of throughput). Triton's queue policy is left off
the steps it admits to, because any policy turns off the batcher's prefetching (a queued
request then waits up to 0.5 s beside an idle instance; docs/architecture.md, "Under
load"). Steps with no admitting step in front (single-step encoders) keep Triton's
``max_queue_size``, sized for 512 concurrent plain clients and more.

The interactive choice, opt-in per entry: ``admission_wait_us = 250000``
(:data:`INTERACTIVE_ADMISSION_WAIT_US`) refuses requests without a deadline once a
quarter second of work waits, so answers stay prompt under overload at the cost of
refusing plain clients that do not retry (the 500-client benchmark: docs/operations.md,
"When the server is full").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Requests waiting in the queue of a step with no admitting step in front before new ones
# are refused (Triton's ``max_queue_size``): 512 concurrent one-sentence clients and more
# are queued, as Triton without a policy and TEI (512) queue them.
CPU_QUEUE = 1024
GPU_QUEUE = 4096
# The most estimated work a request that states no deadline may find waiting for an
# encoder before it is refused: the longest wait a plain client is asked to sit through
# (half of a 60 s client time-out). 500 concurrent one-sentence all-MiniLM-L6-v2 clients
# queue about a second of it on the 2-core CPU (docs/benchmarks.md, "Overload").
CPU_ADMISSION_WAIT_US = 30_000_000
GPU_ADMISSION_WAIT_US = 30_000_000
# The opt-in interactive bound (an entry's ``admission_wait_us``): a quarter second.
INTERACTIVE_ADMISSION_WAIT_US = 250_000
# Rows that may wait for one encoder (its queue's memory). Text: a row holds up to the
# model's window of int64 ids, mask and type ids (256 tokens: 6 KiB), so 8,192 rows hold
# at most 48 MiB, 65,536 at most 384 MiB. Images: a row holds the encoded image (a few
# hundred KiB typical, the fetch cap at most).
CPU_TEXT_ROWS = 8192
CPU_IMAGE_ROWS = 512
GPU_TEXT_ROWS = 65536
GPU_IMAGE_ROWS = 4096

_CPU_COMMON = {
    "max_queue_delay_us": 0,
    "max_queue_size": CPU_QUEUE,
    "admission_wait_us": CPU_ADMISSION_WAIT_US,
    "encoder_instances": 2,
    "ort_threads_shared": -1,
    "ort_spin_us": 20,
}
_GPU_COMMON = {
    "max_queue_delay_us": 1000,
    "max_queue_size": GPU_QUEUE,
    "admission_wait_us": GPU_ADMISSION_WAIT_US,
}

# Profiles by device, then by the kind of input the family's encoder takes.
PROFILES: Mapping[str, Mapping[str, Mapping[str, object]]] = MappingProxyType({
    "cpu": MappingProxyType({
        "text": MappingProxyType({
            **_CPU_COMMON,
            "admission_max_rows": CPU_TEXT_ROWS,
            "max_batch_size": 64,
            "max_rows_per_run": 64,
            "max_padding_share": 0.1,
            "fused_tokenize": False,
        }),
        "image": MappingProxyType({
            **_CPU_COMMON,
            "admission_max_rows": CPU_IMAGE_ROWS,
            "max_batch_size": 32,
        }),
    }),
    "gpu": MappingProxyType({
        "text": MappingProxyType({
            **_GPU_COMMON,
            "admission_max_rows": GPU_TEXT_ROWS,
            "max_batch_size": 512,
            "max_rows_per_run": 512,
            "max_padding_share": 0.5,
            "encoder_instances": 8,
            "preprocess_instances": 8,
        }),
        "image": MappingProxyType({
            **_GPU_COMMON,
            "admission_max_rows": GPU_IMAGE_ROWS,
            "max_batch_size": 256,
            "max_rows_per_run": 256,
            "encoder_instances": 4,
            "preprocess_instances": 12,
            "max_batch_pixels": 536_870_912,
        }),
    }),
})

IMAGE_FAMILIES = frozenset({"open-clip"})
# Keys that only some entries may take: given only where the entry can.
_FAMILY_KEYS = {"fused_tokenize": "sentence-transformers"}
_PYTHON_ORT_KEYS = frozenset({"fused_tokenize"})


def profile_defaults(device: str, family: str, encoder_backend: str) -> dict[str, object]:
    """The profile's value of every knob an entry of ``family`` on ``device`` may take.

    Unknown devices get no defaults (the manifest's own check refuses them).
    """
    kinds = PROFILES.get(device)
    if kinds is None:
        return {}
    profile = kinds["image" if family in IMAGE_FAMILIES else "text"]
    return {
        key: value
        for key, value in profile.items()
        if _FAMILY_KEYS.get(key, family) == family
        and (key not in _PYTHON_ORT_KEYS or encoder_backend == "python-ort")
    }


def describe() -> str:
    """The profiles as text (``python -m generator defaults``)."""
    lines = []
    for device, kinds in PROFILES.items():
        for kind, profile in kinds.items():
            lines.append(f"[{device}, {kind}]")
            lines.extend(f"  {key} = {value!r}" for key, value in profile.items())
    return "\n".join(lines)
