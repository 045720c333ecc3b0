"""A model folder names its adapter as declared by ``embed_runtime.steps.Adapter``."""

from __future__ import annotations

import pytest

from embed_runtime.steps import Adapter
from generator.build import adapter_path
from generator.model_dir import ModelDir


def test_model_dir_refuses_an_adapter_name_no_adapter_has() -> None:
    with pytest.raises(ValueError, match="unknown adapter 'encdoe'; the adapters are: ") as exc:
        ModelDir("m_encode", "", "encdoe")
    assert all(a.value in str(exc.value) for a in Adapter)


def test_model_dir_takes_an_adapter_by_its_name_or_its_member() -> None:
    assert ModelDir("m_encode", "", "encode").adapter is Adapter.ENCODE
    multivector = Adapter.ENCODE_MULTIVECTOR
    assert ModelDir("m_encode", "", multivector).adapter is multivector
    assert ModelDir("m", "", None).adapter is None


@pytest.mark.parametrize("adapter", list(Adapter))
def test_every_declared_adapter_has_its_model_py(adapter: Adapter) -> None:
    source = adapter_path(adapter)
    assert source.is_file(), source
    assert "class TritonPythonModel" in source.read_text()
