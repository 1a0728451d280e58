"""TOML configuration files of node homes, validated against the config dataclasses.

Each section of a node's `config.toml` fills one frozen dataclass of `gentorrent.config`, and
the role that reads the file applies every section it accepts (`Schema`): gt-user reads
[cloves], [overlay], [user_api] and [audits]; gt-model reads [model_node], [routing], [cloves]
and [overlay]. Any other section stops the node with one line that says who reads it: a section
another role reads, or one no node may set alone ([epochs], [reputation]: the committee's
rules, fixed by its genesis; [wire]: protocol limits every node shares).

Validation is strict because a silently ignored typo (or section) in a distributed system shows
up hours later as "the gossip interval is wrong on one node": an unknown section or key, or a
value of the wrong type, is a `ConfigError` that names the file, the key, and the closest known
key.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gentorrent import config as cfg

#: every section a config.toml may name, and the dataclass it fills
SECTIONS: dict[str, type] = {
    "wire": cfg.WireLimits,
    "cloves": cfg.CloveParams,
    "overlay": cfg.OverlayParams,
    "routing": cfg.RoutingParams,
    "reputation": cfg.ReputationParams,
    "epochs": cfg.EpochParams,
    "consensus": cfg.ConsensusTimeouts,
    "model_node": cfg.ModelNodeParams,
    "user_api": cfg.UserApiParams,
    "audits": cfg.AuditParams,
}

_GENESIS = "it is the committee's, the same for every member: its genesis sets it (app_state.{0}, " \
           "gentorrent/ledger/chain_params.py)"
#: who reads each section: what a role that does not read it answers
READERS: dict[str, str] = {
    "wire": "no node sets it: protocol limits every node shares (gentorrent/config.py WireLimits)",
    "cloves": "gt-user and gt-model read it",
    "overlay": "gt-user and gt-model read it",
    "routing": "gt-model reads it",
    "reputation": _GENESIS.format("reputation"),
    "epochs": _GENESIS.format("epochs"),
    "consensus": "gt-verifier reads its timeouts from its home's config.json (\"timeouts\": default or fast)",
    "model_node": "gt-model reads it",
    "user_api": "gt-user reads it",
    "audits": "gt-user reads it",
}
assert set(READERS) == set(SECTIONS)


@dataclass(frozen=True)
class Schema:
    """The sections one role reads from its home's config.toml, and applies, every one."""

    role: str
    sections: Mapping[str, type]


#: a node home's configuration file (optional: every section has the paper's defaults)
CONFIG_FILE = "config.toml"
#: what gt-user applies
USER = Schema("gt-user", {name: SECTIONS[name] for name in ("cloves", "overlay", "user_api", "audits")})
#: what gt-model applies (and the stand-in model node, which must decode with its askers' k)
MODEL = Schema("gt-model", {name: SECTIONS[name] for name in ("model_node", "routing", "cloves", "overlay")})

MAX_CONFIG_BYTES = 256 * 1024


class ConfigError(ValueError):
    """A configuration file is unreadable, malformed, or names something unknown."""


def load(path: Path, schema: Schema | Mapping[str, type]) -> dict[str, Any]:
    """Parse `path` into {section: dataclass instance}; absent sections get defaults."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse(doc, schema, str(path))


def load_home(home: Path, schema: Schema | Mapping[str, type]) -> dict[str, Any]:
    """A node home's CONFIG_FILE against `schema`; every section at its defaults when absent."""
    path = Path(home) / CONFIG_FILE
    return load(path, schema) if path.exists() else parse({}, schema)


def parse(doc: Mapping[str, Any], schema: Schema | Mapping[str, type], source: str = "config") -> dict[str, Any]:
    """{section: dataclass instance} of every section of `schema`, from `doc` or defaults."""
    role = schema.role if isinstance(schema, Schema) else None
    schema = schema.sections if isinstance(schema, Schema) else schema
    result: dict[str, Any] = {}
    for section, values in doc.items():
        if section not in schema and role is not None and section in READERS:
            raise ConfigError(f"{source}: [{section}] is not read by {role}: {READERS[section]}")
        if section not in schema:
            raise ConfigError(f"{source}: unknown section [{section}]{_hint(section, schema if role is None else SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        result[section] = _build(schema[section], values, f"{source}: {section}")
    for section, cls in schema.items():
        result.setdefault(section, cls())
    return result


def _build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{where}.{key}: unknown key{_hint(key, fields)}")
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _coerce(value: Any, expected: Any, where: str) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected in (int, float, str, bool):
        if type(value) is not expected:
            raise ConfigError(f"{where}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
        return value
    origin = typing.get_origin(expected)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = {a for a in typing.get_args(expected) if a is not Ellipsis} or {Any}
        items = [v if item is Any else _coerce(v, item, where) for v in value]
        return tuple(items) if origin is tuple else items
    return value


def _hint(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def render(sections: Mapping[str, Any]) -> str:
    """A documented TOML file holding `sections` (what `init` commands write into a home)."""
    lines = ["# GenTorrent node configuration. Unknown keys are rejected by name.", ""]
    for name, obj in sections.items():
        lines.append(f"[{name}]")
        for f in dataclasses.fields(obj):
            lines.append(f"{f.name} = {_toml_value(getattr(obj, f.name))}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {type(value).__name__} to TOML")


def _toml_string(value: str) -> str:
    """A TOML basic string: quote, backslash and every control character escaped."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
