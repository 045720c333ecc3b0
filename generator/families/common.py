"""Model dirs every family renders the same way: tokenizer, encoder, ensemble."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embed_runtime.engines.contract import COUNT_OUTPUT
from embed_runtime.engines.ort_encoder import EncoderParams
from embed_runtime.engines.output_precision import CALIBRATION_FILE, EXTRA_PRECISIONS, FORMS
from embed_runtime.engines.sparse import INDICES, VALUES
from embed_runtime.engines.sparse_router import (
    QUERY_TOKENIZER_FILE,
    QUERY_WEIGHTS_FILE,
    QueryRouteParams,
)
from embed_runtime.serving.admission import ADMISSION_PEEK
from embed_runtime.serving.chunks_step import CHUNK_ROW, CHUNK_SPAN, ChunksParams
from embed_runtime.steps import Adapter
from embed_runtime.text.tokenizer import TokenizerParams

from ..manifest import ModelEntry
from ..model_dir import ModelDir
from ..onnx_export import GraphSpec
from ..render import (
    Accelerator,
    Batching,
    Instances,
    IOSpec,
    Step,
    ensemble,
    onnxruntime_model,
    python_model,
)
from .spec import LITELLM_SUFFIX, OPENAI_SUFFIX, admits, serves_openai

# The optional per-row token count of text ensembles (python-ort encoders that take an
# attention mask): the tokens the encoder saw, prompt and special tokens included.
TOKEN_COUNT = IOSpec("TOKEN_COUNT", "TYPE_INT32", (1,))

# The optional quantized forms of EMBEDDING (python-ort text encoders; the request asks
# for the one it wants): float16, int8 / uint8 (calibrated ranges), binary / ubinary
# (packed bits). Width [-1]: k values, or ceil(k / 8) bytes for the packed forms.
PRECISION_OUTPUTS = tuple(IOSpec(FORMS[p][0], FORMS[p][2], (-1,)) for p in EXTRA_PRECISIONS)

# Where TensorRT keeps its engines inside the Docker image (docker-compose.yml mounts a
# volume there, so engines survive a restart instead of being rebuilt for minutes).
TRT_ENGINE_CACHE_DIR = "/var/cache/triton-embeddings/tensorrt"
TRT_WORKSPACE_BYTES = 1 << 30

# The public input of text models: one string a row.
TEXT = IOSpec("TEXT", "TYPE_STRING", (1,))
# LiteLLM's triton/ embedding provider sends its texts as ``input_text`` of shape [N] (no
# row dim): a non-batching ensemble takes that and Triton reshapes it to the steps' [N, 1].
LITELLM_INPUT = IOSpec("input_text", "TYPE_STRING", (-1,), reshape=(-1, 1))


def tokenize_dir(
    entry: ModelEntry,
    name: str,
    tokenizer_json: Path,
    params: TokenizerParams,
    dims: int,
    float32_only: bool = False,
    *,
    encoder: str,
) -> ModelDir:
    """A ``tokenize`` Python model: ``TEXT`` -> token tensors of width ``dims`` (-1: ragged).

    ``float32_only``: the encoder after it answers ``EMBEDDING`` alone (Triton's native
    backend), so this step refuses a request ``precision`` other than float32 itself.
    ``encoder`` is the model after it, which it admits requests to
    (:func:`admission_parameters`).
    """
    config = python_model(
        name,
        entry.max_batch_size,
        [TEXT],
        [IOSpec(n, "TYPE_INT64", (dims,)) for n in params.output_names],
        {
            **tokenizer_parameters(entry, dataclasses.replace(params, float32_only=float32_only)),
            **admission_parameters(entry, encoder),
        },
        step_batching(entry, entry.max_queue_delay_us // 2, admitted=admits(entry)),
        Instances(entry.preprocess_instances),
    )
    return ModelDir(name, config, Adapter.TOKENIZE, {"tokenizer.json": tokenizer_json})


def tokenizer_parameters(entry: ModelEntry, params: TokenizerParams) -> dict[str, str]:
    """Config parameters of a tokenizer (``TokenizerParams``), the entry's byte caps on."""
    caps = dataclasses.replace(
        params,
        max_text_bytes=entry.max_text_bytes,
        max_request_bytes=entry.max_request_text_bytes,
    )
    return {**caps.to_parameters(), "tokenizer_file": "tokenizer.json"}


def _trt_profiles(inputs: Sequence[IOSpec], max_batch_size: int) -> dict[str, str]:
    """TensorRT shape profiles (batch 1 .. max) when every non-batch dim is fixed."""
    if any(d < 0 for t in inputs for d in t.dims):
        return {}

    def shapes(batch: int) -> str:
        return ",".join(f"{t.name}:{'x'.join(map(str, (batch, *t.dims)))}" for t in inputs)

    return {
        "trt_profile_min_shapes": shapes(1),
        "trt_profile_opt_shapes": shapes(max_batch_size),
        "trt_profile_max_shapes": shapes(max_batch_size),
    }


def gpu_accelerator(entry: ModelEntry, inputs: Sequence[IOSpec]) -> Accelerator | None:
    """The native backend's GPU execution accelerator for ``entry`` (None: plain CUDA EP)."""
    if entry.device != "gpu" or entry.gpu_accelerator != "tensorrt":
        return None
    parameters = {
        "precision_mode": "FP16" if entry.precision == "fp16" else "FP32",
        "max_workspace_size_bytes": str(TRT_WORKSPACE_BYTES),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": TRT_ENGINE_CACHE_DIR,
        **_trt_profiles(inputs, entry.max_batch_size),
    }
    return Accelerator("tensorrt", tuple(parameters.items()))


def admission_parameters(entry: ModelEntry, encoder: str) -> dict[str, str]:
    """Config parameters of a step that admits requests to the model ``encoder``.

    Read by ``embed_runtime.serving.admission.AdmissionGate``; none where
    :func:`admits` is false.
    """
    if not admits(entry):
        return {}
    return {
        "admission_encoder": encoder,
        "admission_wait_us": str(entry.admission_wait_us),
        "admission_max_rows": str(entry.admission_max_rows),
    }


def step_batching(
    entry: ModelEntry, max_queue_delay_us: int, *, admitted: bool = False
) -> Batching:
    """Dynamic batching of one step of ``entry``, its queue bounded as the manifest says.

    ``admitted``: the step admits requests itself, or sits behind one that does; its
    queue then carries no Triton policy, which would turn the batcher's prefetching off
    (``embed_runtime/ops/backlog_board.py``).
    """
    if admitted:
        return Batching(True, max_queue_delay_us)
    return Batching(
        True,
        max_queue_delay_us,
        max_queue_size=entry.max_queue_size,
        queue_timeout_us=entry.queue_timeout_us,
    )


def _encoder_scheduling(entry: ModelEntry, admitted: bool = False) -> tuple[Batching, Instances]:
    """Dynamic batching and instance group of an encoder (either kind, fused or not).

    ``admitted``: a step in front admits its requests (:func:`admits`).
    """
    kind = "KIND_GPU" if entry.device == "gpu" else "KIND_CPU"
    batching = step_batching(entry, entry.max_queue_delay_us, admitted=admitted)
    return batching, Instances(entry.encoder_instances, kind)


@dataclass(frozen=True)
class TextGraph:
    """An exported text encoder and the tokenizer that feeds it.

    ``limits`` (``vocab_size``, ``type_vocab_size``, ``max_width``) bound what a direct
    call may send the Python runner's token inputs.
    """

    onnx_path: Path
    spec: GraphSpec
    tokenizer_json: Path
    tok_params: TokenizerParams
    limits: dict[str, int] | None = None


@dataclass(frozen=True)
class RunnerExtras:
    """What the Python ORT runner answers beyond the graph's rows (the native backend: none).

    ``max_dimensions`` D > 0 lets it truncate to a request's ``dimensions`` (the output is
    then ``[-1]``). ``token_count`` adds its ``TOKEN_COUNT`` output. ``sparse``: the graph's
    dense rows are answered as the ``SPARSE_INDICES`` / ``SPARSE_VALUES`` of their active
    dimensions, and nothing else. ``forms``: the quantized outputs of
    :data:`PRECISION_OUTPUTS` it answers; ``calibration`` (the embeddings saved by
    :mod:`generator.calibration`) gives int8 / uint8 their ranges.
    """

    max_dimensions: int = 0
    token_count: bool = False
    sparse: SparseOutput | None = None
    forms: Sequence[IOSpec] = ()
    calibration: Path | None = None


def encoder_dir(
    entry: ModelEntry,
    name: str,
    onnx_path: Path,
    spec: GraphSpec,
    ragged: bool,
    *,
    limits: dict[str, int] | None = None,
    extras: RunnerExtras = RunnerExtras(),
) -> ModelDir:
    """An encoder: the Python ORT runner, or Triton's native ``onnxruntime`` backend.

    ``limits`` (``vocab_size``, ``type_vocab_size``, ``max_width``) bound what a direct
    call may send the Python runner's token inputs; ``extras`` what else it answers.
    """
    batching, instances = _encoder_scheduling(entry, admitted=admits(entry))
    outputs = [IOSpec.from_tensor(t) for t in spec.outputs]
    if entry.encoder_backend == "onnxruntime":
        inputs = [IOSpec.from_tensor(t) for t in spec.inputs]
        config = onnxruntime_model(
            name,
            entry.max_batch_size,
            inputs,
            outputs,
            batching,
            instances,
            accelerator=gpu_accelerator(entry, inputs),
        )
        return ModelDir(name, config, None, {"model.onnx": onnx_path})
    parameters = _python_encoder_parameters(entry, spec, ragged, limits, extras.max_dimensions)
    files = {"model.onnx": onnx_path}
    if extras.sparse is not None:
        parameters.update(extras.sparse.parameters())
        outputs = list(extras.sparse.outputs())
    else:
        if extras.max_dimensions:
            outputs = [IOSpec(o.name, o.data_type, (-1,)) for o in outputs]
        outputs.extend((*([TOKEN_COUNT] if extras.token_count else []), *extras.forms))
        if extras.calibration is not None:
            files[CALIBRATION_FILE] = extras.calibration
    inputs = [IOSpec.from_tensor(t, ragged=ragged) for t in spec.inputs]
    config = python_model(
        name, entry.max_batch_size, inputs, outputs, parameters, batching, instances
    )
    return ModelDir(name, config, Adapter.ENCODE, files)


def _resolved_normalize(entry: ModelEntry) -> bool:
    """``entry.normalize``, which the family's build must have decided by now."""
    if entry.normalize is None:
        raise ValueError(
            f"{entry.name}: normalize is unset; the family's build decides it from the "
            "pipeline before rendering (sentence_transformers.export.resolved_normalize)"
        )
    return entry.normalize


def split_encoder_dirs(
    entry: ModelEntry, graph: TextGraph, extras: RunnerExtras = RunnerExtras()
) -> list[ModelDir]:
    """``<name>_tokenize`` (``TEXT`` -> ragged token rows) and ``<name>_encode`` after it.

    The encoder (:func:`encoder_dir`) takes the rows ragged. Before Triton's native
    backend, the tokenize step refuses a request ``precision`` other than float32
    (``float32_only``).
    """
    native = entry.encoder_backend != "python-ort"
    tokenize = tokenize_dir(
        entry,
        f"{entry.name}_tokenize",
        graph.tokenizer_json,
        graph.tok_params,
        -1,
        native,
        encoder=f"{entry.name}_encode",
    )
    encode = encoder_dir(
        entry,
        f"{entry.name}_encode",
        graph.onnx_path,
        graph.spec,
        True,
        limits=graph.limits,
        extras=extras,
    )
    return [tokenize, encode]


@dataclass(frozen=True)
class SparseOutput:
    """A sparse encoder's answer: active dimensions, at most ``max_active_dims`` (0: all)."""

    max_active_dims: int = 0

    def parameters(self) -> dict[str, str]:
        """Config parameters the runner reads (``EncoderParams.sparse``, ``max_active_dims``)."""
        return EncoderParams.partial_parameters(sparse=True, max_active_dims=self.max_active_dims)

    @staticmethod
    def outputs() -> tuple[IOSpec, IOSpec]:
        """``SPARSE_INDICES`` INT32 and ``SPARSE_VALUES`` FP32, each ``[-1]`` (K per request)."""
        return IOSpec(INDICES, "TYPE_INT32", (-1,)), IOSpec(VALUES, "TYPE_FP32", (-1,))


def _python_encoder_parameters(
    entry: ModelEntry,
    spec: GraphSpec,
    ragged: bool,
    limits: dict[str, int] | None,
    max_dimensions: int,
) -> dict[str, str]:
    """Config parameters of the Python ORT runner (:class:`EncoderParams`) for ``entry``.

    ``limits`` (``vocab_size``, ``type_vocab_size``, ``max_width``) are written as given.
    """
    cpu = entry.device == "cpu"
    params = EncoderParams(
        onnx_file="model.onnx",
        input_names=tuple(spec.input_names),
        output_name=spec.output_names[0],
        ragged=ragged,
        max_rows_per_run=entry.max_rows_per_run,
        max_padding_share=float(entry.max_padding_share),
        intra_op_threads=entry.ort_threads,
        shared_intra_op_threads=entry.ort_threads_shared if cpu else 0,
        allow_spinning=entry.ort_spinning,
        spin_duration_us=entry.ort_spin_us or 0,
        graph_optimization=entry.graph_optimization,
        execution_provider="cpu" if cpu else "cuda",
        max_dimensions=max_dimensions,
        default_dimensions=(entry.truncate_dim or 0) if max_dimensions else 0,
        normalize=_resolved_normalize(entry) if max_dimensions else False,
        weight_cache=entry.ort_weight_cache or not cpu,
    )
    return {**params.to_parameters(), **{key: str(value) for key, value in (limits or {}).items()}}


def fused_encoder_dir(
    entry: ModelEntry,
    name: str,
    graph: TextGraph,
    *,
    forms: Sequence[IOSpec] = (),
    calibration: Path | None = None,
) -> ModelDir:
    """The Python ORT encoder taking ``TEXT`` itself (``fused_tokenize``): no tokenize step.

    It reads the tokenizer's parameters beside its own and tokenizes each execution's
    rows in its own stub, so a request crosses one Python model instead of two.
    ``TEXT`` is a fixed [1] input: requests batch without ragged inputs. It also answers
    ``TOKEN_COUNT`` when ``entry.token_count`` asks for it or ``<name>_openai`` needs it
    (:func:`serves_openai`), and ``forms`` (with ``calibration`` for int8 / uint8) as
    :func:`encoder_dir` does.
    """
    dims = graph.tok_params.max_dimensions
    output = graph.spec.outputs[0]
    outputs = [IOSpec(output.name, output.triton_dtype, (-1,) if dims else output.dims)]
    if entry.token_count or serves_openai(entry):
        outputs.append(TOKEN_COUNT)
    outputs.extend(forms)
    return text_encoder_dir(
        entry,
        name,
        Adapter.ENCODE,
        graph,
        outputs=outputs,
        parameters=EncoderParams.partial_parameters(fused_tokenize=True),
        files={CALIBRATION_FILE: calibration} if calibration is not None else {},
        max_dimensions=dims,
    )


def text_encoder_dir(
    entry: ModelEntry,
    name: str,
    stub: Adapter,
    graph: TextGraph,
    *,
    outputs: Sequence[IOSpec],
    parameters: dict[str, str],
    files: dict[str, Path] | None = None,
    max_dimensions: int = 0,
) -> ModelDir:
    """A Python encoder (model ``stub``) that takes ``TEXT`` and tokenizes it itself.

    Its config parameters are the ORT runner's, the tokenizer's, then ``parameters``; its
    files the graph, the tokenizer, then ``files``. The fused encoder is one
    (:func:`fused_encoder_dir`); so are the encoders that tokenize per request ``task``
    (multi-vector, inference-free sparse), which the split tokenize step could not serve.
    """
    runner = _python_encoder_parameters(entry, graph.spec, False, graph.limits, max_dimensions)
    config = python_model(
        name,
        entry.max_batch_size,
        [TEXT],
        outputs,
        {**runner, **tokenizer_parameters(entry, graph.tok_params), **parameters},
        *_encoder_scheduling(entry),
    )
    files = {"model.onnx": graph.onnx_path, "tokenizer.json": graph.tokenizer_json, **(files or {})}
    return ModelDir(name, config, stub, files)


@dataclass(frozen=True)
class QueryRoute:
    """An inference-free sparse encoder's query route: its tokenizer and static weights.

    Both are files of ``folder``, named as in the encoder's model dir:
    :data:`QUERY_TOKENIZER_FILE` and :data:`QUERY_WEIGHTS_FILE`. Its config parameters
    are ``embed_runtime.engines.sparse_router.QueryRouteParams``.
    """

    folder: Path
    max_length: int
    pad_id: int = 0
    lowercase: bool = False

    def files(self) -> dict[str, Path]:
        """The route's files, by their name in the model dir."""
        return {name: self.folder / name for name in (QUERY_TOKENIZER_FILE, QUERY_WEIGHTS_FILE)}

    def parameters(self) -> dict[str, str]:
        """Config parameters the query route reads (``QueryRouteParams``)."""
        route = QueryRouteParams(
            max_length=self.max_length, pad_id=self.pad_id, lowercase=self.lowercase
        )
        return route.to_parameters()


def _mapped(name: str | tuple[str, str]) -> tuple[str, str]:
    """``(model tensor, ensemble tensor)`` of a step's name in :func:`chain_dir`."""
    return name if isinstance(name, tuple) else (name, name)


def chain_dir(
    entry: ModelEntry,
    name: str,
    public_input: IOSpec,
    dim: int,
    steps: Sequence[tuple[str, Sequence[str | tuple[str, str]], Sequence[str | tuple[str, str]]]],
    extra_outputs: Sequence[IOSpec] = (),
) -> ModelDir:
    """An ensemble running ``steps`` (model, input names, output names) one after another.

    Tensor names are shared between steps: a step's outputs feed the next step's inputs
    of the same name; the last step must output ``EMBEDDING`` (and ``extra_outputs``).
    A name may be a pair ``(the model's tensor, the ensemble's tensor)`` instead.
    """
    config = ensemble(
        name,
        entry.max_batch_size,
        [public_input],
        [IOSpec("EMBEDDING", "TYPE_FP32", (dim,)), *extra_outputs],
        [
            Step(model, tuple(map(_mapped, ins)), tuple(map(_mapped, outs)))
            for model, ins, outs in steps
        ],
    )
    return ModelDir(name, config, None, {})


# ``<name>_chunks``: a long text's bytes and chunks are bounded apart from a plain row's.
CHUNK_TEXT_BYTES = 1 << 20
CHUNK_REQUEST_BYTES = 8 << 20
MAX_CHUNKS = 4096


def chunks_dir(entry: ModelEntry, graph: TextGraph, dim: int, late=None) -> ModelDir:
    """``<name>_chunks``: ``TEXT`` rows cut into chunks, each embedded by ``<name>``.

    One output row per chunk: ``EMBEDDING``, ``CHUNK_ROW`` (its input row), ``CHUNK_SPAN``
    (start and end in that row, ``str`` indices) and ``TOKEN_COUNT`` (its tokens).
    A row may be up to :data:`CHUNK_TEXT_BYTES`; a request makes at most
    :data:`MAX_CHUNKS` chunks (``embed_runtime.serving.chunks_step``). ``late`` (a
    ``sentence_transformers.late_chunking.LateGraphs``): it also answers late chunking.
    """
    caps = dataclasses.replace(
        graph.tok_params, max_text_bytes=CHUNK_TEXT_BYTES, max_request_bytes=CHUNK_REQUEST_BYTES
    )
    chunks = ChunksParams(
        target_model=entry.name,
        target_max_batch=entry.max_batch_size,
        target_max_request_bytes=entry.max_request_text_bytes,
        max_chunks=MAX_CHUNKS,
        normalize=_resolved_normalize(entry),
        late_window=late.window if late else 0,
        bulk_instances=_bulk_instances(entry),
    )
    outputs = [
        IOSpec("EMBEDDING", "TYPE_FP32", (dim,)),
        IOSpec(CHUNK_ROW, "TYPE_INT32", (1,)),
        IOSpec(CHUNK_SPAN, "TYPE_INT64", (2,)),
        IOSpec(COUNT_OUTPUT, "TYPE_INT32", (1,)),
    ]
    config = python_model(
        f"{entry.name}_chunks",
        entry.max_batch_size,
        [TEXT],
        outputs,
        {
            **caps.to_parameters(),
            "tokenizer_file": "tokenizer.json",
            **chunks.to_parameters(),
            **chunk_admission(entry),
        },
        step_batching(entry, 0),
        # An execution waits for all its chunks; other instances keep the encoder fed
        # meanwhile (one instance: 0.75x of plain rows, two per encoder instance: 1.02x;
        # bench.long_documents).
        Instances(max(2, entry.preprocess_instances, 2 * entry.encoder_instances)),
    )
    files = {"tokenizer.json": graph.tokenizer_json}
    if late is not None:
        files.update({late.tokens.name: late.tokens, late.head.name: late.head})
    return ModelDir(f"{entry.name}_chunks", config, Adapter.CHUNKS, files)


def _bulk_instances(entry: ModelEntry) -> int:
    """The encoder's instances, where documents leave one free for queries (two or more)."""
    return entry.encoder_instances if admits(entry) and entry.encoder_instances > 1 else 0


def chunk_admission(entry: ModelEntry) -> dict[str, str]:
    """``<name>_chunks`` admits a request's chunks as one unit, counting nothing itself.

    Its parts go on through ``<name>``, whose tokenize step counts them (they carry the
    grant, so none waits behind its siblings in the count).
    """
    params = admission_parameters(entry, f"{entry.name}_encode")
    return {**params, ADMISSION_PEEK: "true"} if params else {}


def litellm_dir(
    entry: ModelEntry, dim: int, steps: Sequence[tuple[str, Sequence[str], Sequence[str]]]
) -> ModelDir:
    """``<name>_litellm``: ``steps`` (as in :func:`chain_dir`) called as LiteLLM calls them.

    Input ``input_text`` [N] BYTES, fed to the first step as ``TEXT`` [N, 1]; output
    ``EMBEDDING`` [N, ``dim``] alone (LiteLLM turns every output it gets into rows). The
    ensemble does not batch (``max_batch_size`` 0): its steps batch as they do for
    ``<name>``, and N may be at most the entry's ``max_batch_size``. The model's default
    prompt and ``truncate_dim`` apply (LiteLLM sends no request parameters).
    """
    name = f"{entry.name}{LITELLM_SUFFIX}"
    outer = {"TEXT": LITELLM_INPUT.name}
    config = ensemble(
        name,
        0,
        [LITELLM_INPUT],
        [IOSpec("EMBEDDING", "TYPE_FP32", (-1, dim))],
        [
            Step(model, tuple((n, outer.get(n, n)) for n in ins), tuple((n, n) for n in outs))
            for model, ins, outs in steps
        ],
    )
    return ModelDir(name, config, None, {})


def openai_dir(
    entry: ModelEntry, dim: int, steps: Sequence[tuple[str, Sequence[str], Sequence[str]]]
) -> ModelDir:
    """``<name>_openai``: the plain ensemble's ``steps`` answering ``TOKEN_COUNT`` too.

    What the OpenAI gateway (``deploy/gateway/openai_gateway.py``) calls, so
    ``usage.prompt_tokens`` counts the model's tokens while ``<name>`` keeps ``EMBEDDING``
    alone (its default outputs are its contract). Input, batching and request parameters
    as ``<name>``; the last step must answer ``EMBEDDING`` and ``TOKEN_COUNT``.
    """
    return chain_dir(entry, f"{entry.name}{OPENAI_SUFFIX}", TEXT, dim, steps, [TOKEN_COUNT])
