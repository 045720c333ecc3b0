"""Model families: each declares itself once, in its own package; this is the registry.

A family package ``generator/families/<family>/`` holds:

- ``__init__.py``: ``FAMILY``, a :class:`Family`: the model dirs an entry builds (steps
  and ensembles), the manifest checks of its entries, what a runtime load of a local
  folder must pass, the model kinds it reproduces exactly, the shared models it needs.
  Light (no torch, no ONNX): the manifest, the CLI, ``model_manager`` and the shared
  models read it;
- ``export.py``: ``build(entry, manifest, work) -> list[ModelDir]``, imported only by a
  build (it pulls in torch and the model's library).

Adding a family: its package, its templates if any, its tests, and one line in
:data:`FAMILIES` below. Importing this package registers them with the manifest
(:func:`generator.manifest.register_families`), which reads no family itself.
"""

from __future__ import annotations

from ..manifest import register_families
from . import cross_encoder, multi_vector, open_clip, sentence_transformers, sparse_encoder
from .spec import Family

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        sentence_transformers.FAMILY,
        open_clip.FAMILY,
        cross_encoder.FAMILY,
        sparse_encoder.FAMILY,
        multi_vector.FAMILY,
    )
}
register_families(FAMILIES.values())


def family(name: str) -> Family:
    """The declaration of family ``name``; KeyError for an unknown one."""
    return FAMILIES[name]


def owners_of(option: str) -> list[str]:
    """The families that take a family-only manifest key."""
    return [f.name for f in FAMILIES.values() if option in f.own_options]
