"""``deploy/healthcheck.py`` imported as a module (it is a script, not in a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[1] / "deploy" / "healthcheck.py"


def load_healthcheck(name: str = "deploy_healthcheck_tests") -> ModuleType:
    """A fresh module object of the health-check script."""
    spec = importlib.util.spec_from_file_location(name, PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
