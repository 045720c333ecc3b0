"""PyLate's own ``ColBERT.encode``, the build's reference for PyLate ColBERT folders.

PyLate 1.6 pins sentence-transformers 5.3 and transformers 5.3, and the project serves
with 6.x / 5.23, so PyLate cannot be imported here. ``make pylate-reference`` installs the
pinned packages (``requirements/pylate-reference.txt``) into a folder of their own,
``.build/pylate-ref`` (``$EMBED_PYLATE_REFERENCE`` elsewhere), which is put first on
``PYTHONPATH`` of a subprocess that runs ``generator/reference/pylate_colbert.py`` with
this interpreter (torch and the rest come from the project's environment). Without that
folder a PyLate folder is refused: its vectors would have nothing to be checked against.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .declared_kind import UnsupportedModelError

ENV = "EMBED_PYLATE_REFERENCE"
DEFAULT_DIR = Path(__file__).resolve().parents[1] / ".build" / "pylate-ref"
SCRIPT = Path(__file__).resolve().parent / "reference" / "pylate_colbert.py"
PINNED_VERSION = "1.6.0"
TIMEOUT_S = 600


def reference_dir() -> Path:
    """The folder of the pinned PyLate packages (it may not exist)."""
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def installed_version(folder: Path | None = None) -> str | None:
    """The PyLate version installed in ``folder`` (None: not installed)."""
    folder = reference_dir() if folder is None else folder
    found = sorted(folder.glob("pylate-*.dist-info")) if folder.is_dir() else []
    return found[0].name.removeprefix("pylate-").removesuffix(".dist-info") if found else None


def require(name: str) -> Path:
    """The reference folder, or a refusal that says how to install it."""
    folder = reference_dir()
    version = installed_version(folder)
    if version != PINNED_VERSION:
        found = f"PyLate {version}" if version else "nothing"
        raise UnsupportedModelError(
            f"{name}: a PyLate ColBERT folder is built only against PyLate's own encode, "
            f"from the pinned PyLate {PINNED_VERSION} in {folder} (found {found}); run "
            f"`make pylate-reference` or set {ENV} to such a folder"
        )
    return folder


def run(args: list[str], folder: Path) -> subprocess.CompletedProcess:
    """Run the reference script with ``folder`` first on ``PYTHONPATH``; raise on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(  # noqa: S603 - this interpreter and the project's own script
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"PyLate reference failed ({' '.join(args[:1])}):\n"
                           f"{done.stderr[-3000:]}")
    return done


class PyLateReference:
    """``encode_query`` / ``encode_document`` of a folder, as PyLate returns them.

    Every text is encoded once, in one subprocess, when first asked for.
    """

    def __init__(self, folder: str, name: str):
        self.folder = folder
        self.reference = require(name)
        self.cache: dict[tuple[str, str], np.ndarray] = {}
        self.version = ""

    def _fill(self, texts: list[str]) -> None:
        missing = sorted({t for t in texts if ("query", t) not in self.cache})
        if not missing:
            return
        with tempfile.TemporaryDirectory() as tmp:
            source, out = Path(tmp) / "texts.json", Path(tmp) / "out.npz"
            source.write_text(json.dumps(missing), encoding="utf-8")
            run(["encode", self.folder, str(source), str(out)], self.reference)
            with np.load(out) as arrays:
                self.version = str(arrays["pylate_version"])
                for i, text in enumerate(missing):
                    self.cache[("query", text)] = arrays[f"q{i}"]
                    self.cache[("document", text)] = arrays[f"d{i}"]

    def _encode(self, task: str, texts: list[str]) -> list[np.ndarray]:
        self._fill(list(texts))
        return [self.cache[(task, t)] for t in texts]

    def encode_query(self, texts: list[str], **_kwargs) -> list[np.ndarray]:
        """PyLate's ``encode(texts, is_query=True)``."""
        return self._encode("query", texts)

    def encode_document(self, texts: list[str], **_kwargs) -> list[np.ndarray]:
        """PyLate's ``encode(texts, is_query=False)``."""
        return self._encode("document", texts)
