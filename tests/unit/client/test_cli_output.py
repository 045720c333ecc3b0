"""What `python -m client embed` writes: one JSON object per text, dense, sparse or multi-vector.

The server side is tested on a real Triton elsewhere; here a stand-in client returns fixed
arrays so that the CLI's records (fields, order, values) and their destination (standard
output or ``--out``) can be checked exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from client import cli


class _Answers:
    """Returns per text what the real client would, and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def embed_texts(self, model, texts, **options):
        self.calls.append(("texts", model, tuple(texts), options))
        return np.arange(2 * len(texts), dtype=np.float32).reshape(len(texts), 2)

    def embed_sparse(self, model, texts, prompt_name=None):
        self.calls.append(("sparse", model, tuple(texts), prompt_name))
        return [
            (np.array([7, i], np.int32), np.array([1.5, 0.25], np.float32))
            for i in range(len(texts))
        ]

    def embed_multivector(self, model, texts, is_query=False):
        self.calls.append(("multivector", model, tuple(texts), is_query))
        return [np.full((i + 1, 2), 0.5, np.float32) for i in range(len(texts))]


def _run(argv: list[str], capsys) -> tuple[_Answers, list[dict]]:
    answers = _Answers()
    args = cli.parse_args(argv)
    assert cli._cmd_embed(answers, args) == 0
    return answers, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_dense_records_per_text(capsys) -> None:
    answers, records = _run(["embed", "--model", "m", "a cat", "a dog"], capsys)
    assert records == [
        {"input": "a cat", "embedding": [0.0, 1.0]},
        {"input": "a dog", "embedding": [2.0, 3.0]},
    ]
    assert answers.calls[0][:3] == ("texts", "m", ("a cat", "a dog"))


def test_sparse_records_per_text(capsys) -> None:
    argv = ["embed", "--sparse", "--model", "sp", "--prompt-name", "query", "a", "b"]
    answers, records = _run(argv, capsys)
    assert records == [
        {"input": "a", "indices": [7, 0], "values": [1.5, 0.25]},
        {"input": "b", "indices": [7, 1], "values": [1.5, 0.25]},
    ]
    assert answers.calls == [("sparse", "sp", ("a", "b"), "query")]


def test_multivector_records_per_text(capsys) -> None:
    answers, records = _run(["embed", "--multivector", "query", "--model", "cb", "a", "b"], capsys)
    assert records == [
        {"input": "a", "task": "query", "embeddings": [[0.5, 0.5]]},
        {"input": "b", "task": "query", "embeddings": [[0.5, 0.5], [0.5, 0.5]]},
    ]
    assert answers.calls == [("multivector", "cb", ("a", "b"), True)]


@pytest.mark.parametrize("mode", [[], ["--sparse"], ["--multivector", "document"]])
def test_out_gets_the_records_and_stdout_nothing(mode, tmp_path, capsys) -> None:
    out = tmp_path / "records.jsonl"
    _, printed = _run(["embed", *mode, "--model", "m", "--out", str(out), "a", "b"], capsys)
    assert printed == []
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["input"] for r in records] == ["a", "b"]
