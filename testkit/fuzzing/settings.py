"""Oracle for the TOML node configuration parser (gentorrent.settings).

Contract checked:
1. load(file) of arbitrary bytes and parse(doc) of arbitrary TOML-shaped documents raise
   only ConfigError;
2. what they accept is fully typed: every known section is an instance of its dataclass and
   every field holds a value of its annotated type (bool is not an int, int is not a str);
3. what they accept survives render(): parsing render(result) gives result back.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import tempfile
import tomllib
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gentorrent import settings
from testkit.fuzzing import Draw, Finding, expect
from testkit.memdisk import tmpfs_root

_SCHEMA = settings.SECTIONS
_SECTIONS = list(_SCHEMA)
_FIELDS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in _SCHEMA.items()}
_STRINGS = ["", "x", "smollm2-135m", "a\nb", 'q"uote', "back\\slash", "tab\tin", "\x00", "é✓", "\x7f"]
_HINTS = {name: typing.get_type_hints(cls) for name, cls in _SCHEMA.items()}
_FILE = (tmpfs_root() or Path(tempfile.gettempdir())) / f"gentorrent-fuzz-settings-{os.getpid()}.toml"
atexit.register(_FILE.unlink, missing_ok=True)


def _value(d: Draw, depth: int = 0) -> Any:
    kind = d.below(9 if depth < 2 else 6)
    if kind == 0:
        return d.choice([0, 1, -1, 3, 2**31, 2**63 - 1, -(2**63)]) if d.flag() else d.uint(2)
    if kind == 1:
        return d.choice([0.0, -0.0, 0.5, 1e308, -1e-300, math.inf, -math.inf, math.nan])
    if kind == 2:
        return d.choice(_STRINGS) if d.flag() else d.blob(8).decode("latin-1")
    if kind == 3:
        return d.flag()
    if kind == 4:
        return datetime(1979, 5, 27, 7, 32, tzinfo=timezone.utc)
    if kind == 5:
        return d.choice([None, b"bytes", ("tuple",), 1 + 2j])  # not TOML: parse() may still be handed them
    if kind in (6, 7):
        return [_value(d, depth + 1) for _ in range(d.below(4))]
    return {d.choice(_SECTIONS + ["x"]): _value(d, depth + 1) for _ in range(d.below(3))}


def _typed_value(d: Draw, hint: Any) -> Any:
    """A value of the field's own type, so that whole documents pass more often."""
    if hint is bool:
        return d.flag()
    if hint is int:
        return d.choice([0, 1, -1, 2**63 - 1, -(2**63), d.uint(4)])
    if hint is float:
        return d.choice([0.0, -0.0, 2.5, math.inf, -math.inf, math.nan, float(d.uint(2))])
    if hint is str:
        return d.choice(_STRINGS) if d.flag() else d.blob(6).decode("latin-1")
    return _value(d)


def _document(d: Draw) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(d.below(4)):
        section = d.choice(_SECTIONS) if d.below(8) else d.choice(["routng", "", "wire.x", "7"])
        if d.below(10) == 0:
            doc[section] = _value(d)
            continue
        table = doc.setdefault(section, {}) if isinstance(doc.get(section, {}), dict) else {}
        for _ in range(d.below(5)):
            keys = _FIELDS.get(section) or ["n"]
            key = d.choice(keys) if d.below(8) else d.choice(keys) + "_"
            hint = _HINTS.get(section, {}).get(key)
            table[key] = _typed_value(d, hint) if hint is not None and d.flag() else _value(d)
    return doc


def _toml_value(v: Any) -> str | None:
    """TOML text of a value built by _value, or None for what TOML cannot hold."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, list):
        items = [_toml_value(x) for x in v]
        return None if None in items else "[" + ", ".join(items) + "]"
    if isinstance(v, dict):
        items = [(json.dumps(k), _toml_value(x)) for k, x in v.items()]
        return None if any(x is None for _, x in items) else "{" + ", ".join(f"{k} = {x}" for k, x in items) + "}"
    return None


def _toml_text(doc: dict[str, Any]) -> str | None:
    lines = []
    for section, table in doc.items():
        if not isinstance(table, dict):
            value = _toml_value(table)
            if value is None:
                return None
            lines.insert(0, f"{json.dumps(section)} = {value}")
            continue
        lines.append(f"[{json.dumps(section)}]")
        for key, value in table.items():
            text = _toml_value(value)
            if text is None:
                return None
            lines.append(f"{json.dumps(key)} = {text}")
    return "\n".join(lines) + "\n"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _matches(value: Any, hint: Any) -> bool:
    if hint in (int, float, str, bool):
        return type(value) is hint
    origin = typing.get_origin(hint)
    if origin in (tuple, list):
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis} or {Any}
        return isinstance(value, origin) and all(item is Any or _matches(v, item) for v in value)
    return True


def _check_result(result: dict[str, Any], where: str) -> None:
    expect(set(result) == set(_SCHEMA), f"{where}: sections {sorted(result)}")
    for name, obj in result.items():
        cls = _SCHEMA[name]
        expect(type(obj) is cls, f"{where}: [{name}] is a {type(obj).__name__}")
        hints = _HINTS[name]
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            expect(_matches(value, hints[f.name]), f"{where}: {name}.{f.name} = {value!r} is not {hints[f.name]}")
    # render() must write what parse() reads back unchanged
    text = settings.render(result)
    try:
        again = settings.parse(tomllib.loads(text), _SCHEMA, "rendered")
    except (tomllib.TOMLDecodeError, settings.ConfigError) as exc:
        raise Finding(f"render() of an accepted config does not parse back: {type(exc).__name__}: {exc}") from exc
    for name, obj in result.items():
        for f in dataclasses.fields(obj):
            a, b = getattr(obj, f.name), getattr(again[name], f.name)
            expect(_same(a, b), f"render() round trip changed {name}.{f.name}: {a!r} -> {b!r}")


def _parse(doc: Any) -> None:
    try:
        result = settings.parse(doc, _SCHEMA, "fuzz")
    except settings.ConfigError:
        return
    _check_result(result, "parse")


def _load(raw: bytes) -> None:
    _FILE.write_bytes(raw)
    try:
        result = settings.load(_FILE, _SCHEMA)
    except settings.ConfigError:
        return
    _check_result(result, "load")


def check(data: bytes) -> None:
    d = Draw(data)
    mode = d.below(3)
    if mode == 0:  # raw bytes as a config file
        _load(d.rest())
    else:  # a document of known sections and keys with values of every type
        doc = _document(d)
        _parse(doc)
        text = _toml_text(doc)
        if text is not None and mode == 2:
            _load(text.encode("utf-8", "surrogatepass"))
