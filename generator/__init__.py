"""Build a Triton model repository for embedding models: export, validate, render."""

# The manifest checks entries against the families, which register themselves on import.
from . import families  # noqa: F401
