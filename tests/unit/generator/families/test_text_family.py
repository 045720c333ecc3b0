"""The declaration the sentence-transformers text families share (``families.text_family``)."""

from __future__ import annotations

from generator.declared_kind import Served
from generator.families.text_family import name_from_source, needs_python_ort, text_family
from generator.manifest import ModelEntry

SERVED = Served(types=("SentenceTransformer",), modules=("Transformer",), tasks=(None,))


def test_needs_python_ort_refuses_the_native_backend_and_says_why() -> None:
    errors: list[str] = []
    native = ModelEntry(name="m", family="x", encoder_backend="onnxruntime")
    needs_python_ort("models[0]", native, errors, "truncate_dim", "the runner truncates")
    needs_python_ort("models[0]", ModelEntry(name="m", family="x"), errors, "truncate_dim")
    assert errors == [
        "models[0]: truncate_dim needs encoder_backend 'python-ort' (the runner truncates)"
    ]


def test_a_runtime_load_is_named_after_the_last_part_of_its_source() -> None:
    assert name_from_source({"source": "org/My Model!/"}) == "My-Model"
    assert name_from_source({"source": "/data/models/mini.v2"}) == "mini.v2"
    assert name_from_source({}) == "model"


def test_a_text_family_checks_its_backend_before_the_family_s_own_checks() -> None:
    def check_entry(where: str, entry: ModelEntry, errors: list[str]) -> None:
        errors.append(f"{where}: own check")

    family = text_family(
        "demo", "demo.package", ("encode",), SERVED, check_entry, python_ort_because="reason"
    )
    errors: list[str] = []
    entry = ModelEntry(name="m", family="demo", source="s", encoder_backend="onnxruntime")
    family.check_entry("w", entry, errors)
    assert errors == ["w: demo needs encoder_backend 'python-ort' (reason)", "w: own check"]
    assert family.steps(entry) == ("encode",)
    assert family.model_dirs(entry) == ("m", "m_encode")
    assert family.required == ("source",)
    assert family.default_name({"source": "a/b"}) == "b"
