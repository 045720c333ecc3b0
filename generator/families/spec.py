"""The declaration every family package exports as ``FAMILY`` (see ``families/__init__``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..declared_kind import Served
    from ..manifest import ModelEntry

Errors = list[str]
# The ensemble LiteLLM's triton/ embedding provider calls (manifest ``litellm = true``).
LITELLM_SUFFIX = "_litellm"
# The ensemble the OpenAI gateway's provider calls (``litellm = true``, python-ort):
# ``TEXT`` in, ``EMBEDDING`` and ``TOKEN_COUNT`` out, so ``usage`` counts the model's tokens.
OPENAI_SUFFIX = "_openai"


def serves_openai(entry: ModelEntry) -> bool:
    """Whether ``entry`` builds ``<name>_openai`` (and its encoder declares ``TOKEN_COUNT``)."""
    return entry.litellm and entry.encoder_backend == "python-ort"


def admits(entry: ModelEntry) -> bool:
    """Whether the steps in front of ``entry``'s encoders admit requests to them.

    They do for a Python encoder (its executions fill the backlog board the step in front
    reads) with ``admission_wait_us`` or ``admission_max_rows`` set; Triton's native
    backend fills no board.
    """
    bounded = entry.admission_wait_us > 0 or entry.admission_max_rows > 0
    return bounded and entry.encoder_backend == "python-ort"


@dataclass(frozen=True)
class Family:
    """What the rest of the generator knows of a family (declared in its package)."""

    name: str
    # The package: FAMILY in its __init__.py, build() in its export.py.
    package: str
    # Step suffixes an entry builds: ``<name>_<step>`` (encode, tokenize, ...).
    steps: Callable[[ModelEntry], tuple[str, ...]]
    # Ensemble suffixes a user calls: ``<name><suffix>`` ("" for the entry's own name).
    ensembles: tuple[str, ...]
    # Manifest keys naming the weights that an entry must have.
    required: tuple[str, ...]
    # Checks of an entry beyond the generic ones: append messages to the list.
    check_entry: Callable[[str, ModelEntry, Errors], None]
    # Runtime loads of a local folder: raise InvalidInputError for custom code.
    check_folder: Callable[[Path], None] | None
    # The name a runtime load gets when the request names none.
    default_name: Callable[[dict[str, Any]], str]
    # The declared model kinds built exactly (declared_kind); None: not read from a folder.
    served: Served | None = None
    # Manifest keys that only this family takes (another family's entry may not set them).
    own_options: tuple[str, ...] = ()
    # Shared models (shared_models.py) that its entries need.
    shared: tuple[str, ...] = ()

    def model_dirs(self, entry: ModelEntry) -> tuple[str, ...]:
        """Every model dir ``entry`` builds: its ensembles, then its steps."""
        return (*self.ensemble_names(entry), *(f"{entry.name}_{s}" for s in self.steps(entry)))

    def ensemble_names(self, entry: ModelEntry) -> tuple[str, ...]:
        """The ensembles a user calls for ``entry``.

        ``<name>_litellm`` where it opts in (``litellm = true``), and ``<name>_openai``
        beside it where the encoder can count tokens (python-ort).
        """
        suffixes = (
            *self.ensembles,
            *((LITELLM_SUFFIX,) if entry.litellm else ()),
            *((OPENAI_SUFFIX,) if serves_openai(entry) else ()),
        )
        return tuple(f"{entry.name}{suffix}" for suffix in suffixes)

    def builder(self) -> Callable:
        """``build(entry, manifest, work)`` of the family (imported now: it pulls in torch)."""
        return importlib.import_module(f"{self.package}.export").build
