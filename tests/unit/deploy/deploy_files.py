"""Paths and parsers shared by the Docker deployment tests (not a test module).

The Dockerfile's instructions by stage and Docker's ``.dockerignore`` rule. The parsed
docker-compose.yml is the ``compose`` fixture of this folder's conftest.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
DOCKERFILE = ROOT / "Dockerfile.triton"
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs" / "deployment.md"


def dockerfile_instructions() -> list[tuple[str, str, str]]:
    """``(stage, INSTRUCTION, arguments)`` with continuation lines joined."""
    joined, buf = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        joined.append(buf + line)
        buf = ""
    out, stage = [], ""
    for line in joined:
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stage = args.split(" AS ")[1].strip() if " AS " in args else ""
        out.append((stage, instruction.upper(), args.strip()))
    return out


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or a parent of it wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        regex = _dockerignore_regex(line.lstrip("!").rstrip("/"))
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored
