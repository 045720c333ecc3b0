"""Settings that write and read their own Triton config parameters.

A model's stub reads its settings from the string ``parameters`` of its
``config.pbtxt``; the build writes them. :class:`ConfigParams` keeps both sides in one
place, as sentence-transformers' modules save and load their own config: a frozen
dataclass lists its fields once, and :meth:`~ConfigParams.to_parameters` /
:meth:`~ConfigParams.from_parameters` derive the keys, the string form and the defaults
from that list. :func:`param` marks what a field needs beyond its type: another key, a
value always written (even at its default), a value written together with another
field, or its own text form.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

_MISSING = dataclasses.MISSING


def param(
    default: Any = _MISSING,
    *,
    key: str | None = None,
    always: bool = False,
    required: bool = False,
    with_field: str | None = None,
    encode: Callable[[Any], str] | None = None,
    decode: Callable[[str], Any] | None = None,
) -> Any:
    """A field of a :class:`ConfigParams` dataclass.

    ``key``: the parameter's name when it differs from the field's. ``always``: written
    even at its default value. ``required``: a config must hold it, though Python code
    may leave it at its default. ``with_field``:
    written whenever that other field is (e.g. a default that only matters beside it).
    ``encode`` / ``decode``: the text form when the field's type does not say it.
    """
    metadata = {
        "key": key,
        "always": always or required,
        "required": required,
        "with": with_field,
        "encode": encode,
        "decode": decode,
    }
    return dataclasses.field(default=default, metadata=metadata)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _value(kind: str, text: str) -> Any:
    if kind == "bool":
        return text.lower() == "true"
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind.startswith("tuple"):
        return tuple(item for item in text.split(",") if item)
    return text


def json_text(value: Mapping | tuple) -> str:
    """A mapping (or a tuple of pairs) as sorted JSON, for ``encode``."""
    return json.dumps(dict(value), ensure_ascii=False, sort_keys=True)


class ConfigParams:
    """Mixin for frozen dataclasses whose fields are Triton config parameters."""

    # What the settings are called in the error for a missing required parameter.
    params_name: ClassVar[str] = "config"
    # The error for a missing required parameter; ``{name}`` is ``params_name``.
    missing_message: ClassVar[str] = "{name} config parameter {key!r} is missing"

    @classmethod
    def _fields(cls) -> list[tuple[dataclasses.Field, str, str]]:
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            kind = "tuple" if str(hint).startswith("tuple") else getattr(hint, "__name__", "")
            out.append((f, f.metadata.get("key") or f.name, kind))
        return out

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> Any:
        """Read the string parameters; a missing required one raises ``ValueError``."""
        values = {}
        for f, key, kind in cls._fields():
            if key in params:
                decode = f.metadata.get("decode")
                values[f.name] = decode(params[key]) if decode else _value(kind, params[key])
            elif f.metadata.get("required") or (
                f.default is _MISSING and f.default_factory is _MISSING
            ):
                raise ValueError(cls.missing_message.format(name=cls.params_name, key=key))
        return cls(**values)

    def to_parameters(self) -> dict[str, str]:
        """The string parameters :meth:`from_parameters` reads back to these settings.

        A field at its default is left out unless it is marked ``always`` or its
        ``with_field`` is written.
        """
        fields = self._fields()
        written = {f.name for f, _, _ in fields if self._writes(f)}
        out = {}
        for f, key, _ in fields:
            if f.name in written or f.metadata.get("with") in written:
                value = getattr(self, f.name)
                encode = f.metadata.get("encode")
                out[key] = encode(value) if encode else _text(value)
        return out

    @classmethod
    def partial_parameters(cls, **values: Any) -> dict[str, str]:
        """The parameters of the fields named in ``values`` alone, in their written form.

        For a build that adds a few of these settings to a model whose others are written
        elsewhere; :meth:`from_parameters` reads them back with the rest.
        """
        fields = {f.name: (f, key) for f, key, _ in cls._fields()}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__name__} has no fields {unknown}")
        out = {}
        for name, value in values.items():
            f, key = fields[name]
            encode = f.metadata.get("encode")
            out[key] = encode(value) if encode else _text(value)
        return out

    def _writes(self, f: dataclasses.Field) -> bool:
        required = f.default is _MISSING and f.default_factory is _MISSING
        return required or f.metadata.get("always") or getattr(self, f.name) != f.default
