"""What a sentence-transformers folder declares itself to be, read before it is loaded.

sentence-transformers converts what it is asked to load: a ``SparseEncoder`` (SPLADE) or
``MultiVectorEncoder`` (ColBERT) folder opened as a ``SentenceTransformer`` becomes a dense
mean-pooled model, with only a log line. Built that way, the export would match the
converted model and serve vectors of a different model than the one the user named. So
each family reads the folder's own declaration first, ``model_type`` in
``config_sentence_transformers.json`` and the module classes of ``modules.json``, and
builds only the pipelines it reproduces exactly; anything else is refused with a message
that names what is not supported. Runtime loads (``model_manager``) run the same check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# What an unsupported declaration is, in a user's words (for the refusal message).
KNOWN_KINDS = {
    "SparseEncoder": "a sparse, SPLADE-style encoder",
    "MultiVectorEncoder": "a multi-vector, ColBERT-style encoder",
    "CrossEncoder": "a reranker",
    "SentenceTransformer": "a dense embedding model",
    "PyLate ColBERT": "a multi-vector, ColBERT-style encoder saved by PyLate",
}
PYLATE = "PyLate ColBERT"  # the declared kind of a folder saved by PyLate
# Module types of a PyLate ColBERT pipeline: a sentence-transformers Transformer, then
# PyLate's Dense projections (family 'multi-vector', generator/families/multi_vector/pylate.py).
PYLATE_MODULES = (("sentence_transformers.models.Transformer",
                   "sentence_transformers.base.modules.Transformer"),
                  "pylate.models.Dense.Dense")
# Keys PyLate writes into config_sentence_transformers.json for its ColBERT models (whose
# modules, a Transformer and a Dense projection, look like a dense pipeline's).
PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length",
               "attend_to_expansion_tokens", "skiplist_words", "do_query_expansion")
MODULE_NOTES = {
    "SpladePooling": "sparse output (vocabulary-sized)",
    "MLMTransformer": "a masked-language-model head (sparse encoders)",
    "SparseStaticEmbedding": "a static sparse embedding (inference-free sparse encoders)",
    "StaticEmbedding": "static token embeddings (no transformer)",
    "Router": "per-task routing between sub-pipelines; family 'sparse-encoder' serves one "
              "Router: inference-free sparse encoders (SparseStaticEmbedding for queries)",
    "LogitScore": "scores from a causal LM's token logits (LLM rerankers)",
    "Asym": "per-task routing between sub-pipelines",
    "MultiVectorMask": "the token scoring mask of multi-vector (ColBERT-style) encoders",
    "HierarchicalTokenPooling": "token pooling (fewer vectors per document)",
    "LambdaTokenPooling": "token pooling (fewer vectors per document)",
}
# Why a declared kind is refused by a family (none today).
KIND_NOTES: dict[str, str] = {}
# The family that builds each declared model type (named in a refusal).
KIND_FAMILIES = {
    "SentenceTransformer": "sentence-transformers",
    "CrossEncoder": "cross-encoder",
    "SparseEncoder": "sparse-encoder",
    "MultiVectorEncoder": "multi-vector",
    PYLATE: "multi-vector",
}
# First modules of a pipeline every family's export starts from (MLMTransformer: the
# sparse encoders' Transformer as sentence-transformers < 6 saved it).
TRANSFORMERS = ("Transformer", "MLMTransformer")
FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json")


@dataclass(frozen=True)
class Served:
    """What a family builds exactly (``Family.served``).

    Declared model types, module classes (the last part of the dotted name in
    ``modules.json``) of pipelines that start with a Transformer, and Transformer tasks
    (None: the folder declares none). ``pipelines`` lists further whole pipelines served
    as they are (module classes in order, e.g. ``("StaticEmbedding", "Normalize")``); a
    pipeline that starts like one of them but differs is refused. ``declared_only``
    refuses a folder that declares no model type.
    """

    types: tuple[str, ...]
    modules: tuple[str, ...]
    tasks: tuple[str | None, ...]
    pipelines: tuple[tuple[str, ...], ...] = ()
    # Only folders that declare one of ``types`` (the library would otherwise build such a
    # model around an undeclared folder, e.g. with a randomly initialised projection).
    declared_only: bool = False
    # Router pipelines served as they are: each a set of (route, module classes) pairs,
    # e.g. inference-free sparse encoders' query -> SparseStaticEmbedding, document ->
    # Transformer + SpladePooling. The Transformer of a route must run one of ``tasks``.
    routes: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = ()
    # Module classes served only at the end of given pipelines after given Transformer
    # tasks, and those tasks only with them: (module, pipeline, tasks), e.g. LogitScore
    # only as [Transformer, LogitScore] after 'text-generation'.
    module_tasks: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = ()


class UnsupportedModelError(ValueError):
    """The folder declares a model kind or module the family does not reproduce exactly."""


@dataclass(frozen=True)
class DeclaredKind:
    """A folder's own declaration; empty fields where it declares nothing."""

    model_type: str | None = None
    modules: tuple[str, ...] = ()
    transformer_task: str | None = None
    # A Router's routes (route -> the module classes of its sub-pipeline, in order), its
    # default route and whether it maps (task, modality) pairs of its own.
    routes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    default_route: str | None = None
    route_mappings: bool = False

    @property
    def module_classes(self) -> tuple[str, ...]:
        """The class name of each module (the last part of its dotted type)."""
        return tuple(m.rsplit(".", 1)[-1] for m in self.modules)


def _json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{what} is unreadable: {exc}") from None


def declared_kind(folder: Path) -> DeclaredKind:
    """Read the declaration of a local sentence-transformers folder (no model code runs)."""
    folder = Path(folder)
    modules: list = []
    if (folder / "modules.json").is_file():
        raw = _json(folder / "modules.json", "modules.json")
        if not isinstance(raw, list):
            raise UnsupportedModelError("modules.json is not a list of modules")
        modules = raw
    types = []
    for module in modules:
        kind = module.get("type") if isinstance(module, dict) else None
        if not isinstance(kind, str):
            raise UnsupportedModelError(f"modules.json has a module without a type: {module!r}")
        types.append(kind)
    model_type = None
    if (folder / "config_sentence_transformers.json").is_file():
        config = _json(folder / "config_sentence_transformers.json",
                       "config_sentence_transformers.json")
        if isinstance(config, dict) and isinstance(config.get("model_type"), str):
            model_type = config["model_type"]
            if model_type == "ColBERT":  # PyLate <= 3
                model_type = PYLATE
        versions = config.get("__version__") if isinstance(config, dict) else None
        if isinstance(config, dict) and (
            any(k in config for k in PYLATE_KEYS)
            or (isinstance(versions, dict) and "pylate" in versions)
        ):
            model_type = PYLATE
    first = modules[0].get("path", "") if modules else ""
    if [t.rsplit(".", 1)[-1] for t in types] == ["Router"]:
        return _router_kind(folder / first, model_type, tuple(types))
    return DeclaredKind(model_type, tuple(types), _transformer_task(folder / first))


def _transformer_task(module_dir: Path) -> str | None:
    """The ``transformer_task`` a Transformer module's folder declares (None: none)."""
    bert_config = module_dir / "sentence_bert_config.json"
    if bert_config.is_file():
        config = _json(bert_config, "sentence_bert_config.json")
        if isinstance(config, dict) and isinstance(config.get("transformer_task"), str):
            return config["transformer_task"]
    return None


def _router_kind(router_dir: Path, model_type: str | None, types: tuple[str, ...]) -> DeclaredKind:
    """A Router folder's declaration, read from its ``router_config.json`` (if any)."""
    if not (router_dir / "router_config.json").is_file():
        return DeclaredKind(model_type, types, None)
    config = _json(router_dir / "router_config.json", "router_config.json")
    try:
        kinds, structure = config["types"], config["structure"]
        routes = tuple(
            (route, tuple(kinds[m].rsplit(".", 1)[-1] for m in members))
            for route, members in sorted(structure.items())
        )
        parameters = config.get("parameters", {})
        library = all(str(kinds[m]).startswith("sentence_transformers.") for m in kinds)
    except (AttributeError, KeyError, TypeError) as exc:
        raise UnsupportedModelError(f"router_config.json is malformed ({exc!r})") from None
    if not library:
        raise UnsupportedModelError(
            f"router_config.json names modules outside sentence-transformers: {kinds}"
        )
    task = next(
        (
            _transformer_task(router_dir / member)
            for members in structure.values()
            for member in members
            if kinds[member].rsplit(".", 1)[-1] in TRANSFORMERS
        ),
        None,
    )
    return DeclaredKind(
        model_type,
        types,
        task,
        routes=routes,
        default_route=parameters.get("default_route"),
        route_mappings=bool(parameters.get("route_mappings")),
    )


def hub_declared_kind(repo_id: str) -> DeclaredKind:
    """The declaration of a Hugging Face hub model: its small JSON files only, no weights."""
    from huggingface_hub import hf_hub_download  # noqa: PLC0415
    from huggingface_hub.errors import EntryNotFoundError  # noqa: PLC0415

    folder = None
    for name in FILES[:2]:
        try:
            folder = Path(hf_hub_download(repo_id, name)).parent
        except EntryNotFoundError:
            continue
    if folder is None:
        return DeclaredKind()
    kind = declared_kind(folder)
    if kind.modules:
        try:
            hf_hub_download(repo_id, "sentence_bert_config.json")
            kind = declared_kind(folder)
        except EntryNotFoundError:
            pass
    return kind


def check_source(family: str, served: Served, source: str, name: str) -> DeclaredKind:
    """:func:`check_served` on a local folder or a hub id (``source`` as the family resolved it)."""
    path = Path(source)
    kind = declared_kind(path) if path.is_dir() else hub_declared_kind(source)
    check_served(family, served, kind, name)
    return kind


def check_served(family: str, served: Served, kind: DeclaredKind, name: str) -> None:
    """Raise :class:`UnsupportedModelError` unless ``family`` builds ``kind`` exactly."""
    served_types, served_modules = served.types, served.modules
    listed = ", ".join(kind.module_classes) or "none"
    if kind.model_type is not None and kind.model_type not in served_types:
        what = KNOWN_KINDS.get(kind.model_type, "a model kind")
        other = KIND_FAMILIES.get(kind.model_type)
        raise UnsupportedModelError(
            f"{name}: the folder declares model_type {kind.model_type!r} ({what}; modules: "
            f"{listed}); family {family!r} builds {' / '.join(served_types)} models only, so "
            "it is refused rather than served as a different model"
            + (f" (use family {other!r})" if other else "")
            + (f"; {KIND_NOTES[kind.model_type]}" if kind.model_type in KIND_NOTES else "")
        )
    if served.declared_only and kind.model_type is None:
        raise UnsupportedModelError(
            f"{name}: the folder declares no model_type (config_sentence_transformers.json; "
            f"modules: {listed}); family {family!r} serves only folders saved as "
            f"{' / '.join(served_types)}, since sentence-transformers would build one around "
            "an undeclared folder (a bare transformer gets a randomly initialised projection)"
        )
    if kind.model_type == PYLATE:
        _check_pylate(family, kind, name, listed)
        return
    if kind.routes:
        _check_routes(family, served, kind, name)
        return
    if _whole_pipeline_served(served, kind, family, name, listed):
        return
    for dotted, cls in zip(kind.modules, kind.module_classes, strict=True):
        if not dotted.startswith("sentence_transformers.") or cls not in served_modules:
            note = MODULE_NOTES.get(cls)
            raise UnsupportedModelError(
                f"{name}: module {dotted!r}"
                + (f" ({note})" if note else "")
                + f" is not supported by family {family!r}, which exports the pipelines "
                f"{' / '.join(served_modules)} exactly (modules of this folder: {listed})"
            )
    if kind.module_classes and kind.module_classes[0] not in TRANSFORMERS:
        raise UnsupportedModelError(
            f"{name}: the pipeline starts with {kind.module_classes[0]!r}; family "
            f"{family!r} needs a Transformer first (modules of this folder: {listed})"
        )
    if kind.transformer_task not in served.tasks:
        tasks = " / ".join(t for t in served.tasks if t)
        raise UnsupportedModelError(
            f"{name}: its Transformer module runs the task {kind.transformer_task!r}; "
            f"family {family!r} serves {tasks} only"
        )
    _check_module_tasks(served, kind, family, name, listed)


def _check_pylate(family: str, kind: DeclaredKind, name: str, listed: str) -> None:
    """A PyLate folder: a Transformer, then PyLate Dense projections, nothing else."""
    transformers, dense = PYLATE_MODULES
    modules = kind.modules
    odd = ([] if modules and modules[0] in transformers else list(modules[:1])) + [
        m for m in modules[1:] if m != dense]
    if odd or len(modules) < 2:
        what = f"module {odd[0]!r}" if odd else "a pipeline without a PyLate Dense"
        raise UnsupportedModelError(
            f"{name}: {what} is not supported in a PyLate ColBERT folder by family "
            f"{family!r}, which serves a Transformer followed by {dense} projections "
            f"(modules of this folder: {listed})"
        )
    if kind.transformer_task not in (None, "feature-extraction"):
        raise UnsupportedModelError(
            f"{name}: its Transformer module runs the task {kind.transformer_task!r}; a "
            "PyLate ColBERT is served with feature extraction only"
        )


def _check_module_tasks(
    served: Served, kind: DeclaredKind, family: str, name: str, listed: str
) -> None:
    """Refuse a ``module_tasks`` module out of its pipeline or task, and the task without it."""
    classes = kind.module_classes
    for module, pipeline, tasks in served.module_tasks:
        note = MODULE_NOTES.get(module)
        what = f"{module}" + (f" ({note})" if note else "")
        if module in classes and classes != pipeline:
            raise UnsupportedModelError(
                f"{name}: family {family!r} serves {what} only as the whole pipeline "
                f"[{', '.join(pipeline)}] (modules of this folder: {listed})"
            )
        if module in classes and kind.transformer_task not in tasks:
            raise UnsupportedModelError(
                f"{name}: {what} needs the Transformer task {' / '.join(tasks)} (a causal "
                f"LM); this folder's Transformer runs {kind.transformer_task!r}"
            )
        if classes and module not in classes and kind.transformer_task in tasks:
            raise UnsupportedModelError(
                f"{name}: a Transformer with the task {kind.transformer_task!r} is served by "
                f"family {family!r} only followed by {module} (modules of this folder: {listed})"
            )


def _whole_pipeline_served(
    served: Served, kind: DeclaredKind, family: str, name: str, listed: str
) -> bool:
    """Whether ``kind`` is one of ``served.pipelines``.

    Refuses a pipeline that only starts like one (a StaticEmbedding, then a Dense).
    """
    classes = kind.module_classes
    library = all(m.startswith("sentence_transformers.") for m in kind.modules)
    if library and classes in served.pipelines:
        return True
    heads = {p[0] for p in served.pipelines}
    if classes and classes[0] in heads and kind.modules[0].startswith("sentence_transformers."):
        note = MODULE_NOTES.get(classes[0])
        allowed = " or ".join(f"[{', '.join(p)}]" for p in served.pipelines if p[0] == classes[0])
        raise UnsupportedModelError(
            f"{name}: the pipeline [{listed}] is not supported by family {family!r}, which "
            f"serves {classes[0]}" + (f" ({note})" if note else "")
            + f" only as the whole pipeline {allowed}"
        )
    return False


def _route_text(routes: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    return "; ".join(f"{route}: {' + '.join(classes)}" for route, classes in routes)


def _plain(routes: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple:
    """``routes`` sorted, MLMTransformer (older releases' sparse Transformer) as Transformer."""
    return tuple(
        sorted((r, tuple("Transformer" if c in TRANSFORMERS else c for c in m)) for r, m in routes)
    )


def _check_routes(family: str, served: Served, kind: DeclaredKind, name: str) -> None:
    """A Router is served only as one of ``served.routes``, default route ``document``."""
    found = _route_text(kind.routes)
    if _plain(kind.routes) not in {_plain(routes) for routes in served.routes}:
        wanted = " or ".join(f"[{_route_text(r)}]" for r in served.routes) or "no Router"
        raise UnsupportedModelError(
            f"{name}: module 'Router' ({MODULE_NOTES['Router']}) with the routes [{found}] "
            f"is not supported by family {family!r}, which serves {wanted}"
        )
    if kind.route_mappings or kind.default_route != "document":
        raise UnsupportedModelError(
            f"{name}: the Router's own route mappings or a default route other than "
            f"'document' (here {kind.default_route!r}) are not supported; family "
            f"{family!r} routes by the request parameter task (query / document, the "
            "default), as encode_query / encode_document do"
        )
    if kind.transformer_task not in served.tasks:
        raise UnsupportedModelError(
            f"{name}: its Transformer module runs the task {kind.transformer_task!r}; "
            f"family {family!r} serves {' / '.join(t for t in served.tasks if t)} only"
        )
