"""The committee's genesis file: who the validators are, from which every proof is checked.

Every client and every verifier holds the same `genesis.json`; the light client trusts exactly
the Ed25519 keys listed here (ARCHITECTURE.md §3.1), and the CometBFT export
(`verifier.abci.cometbft_export`) turns this file into CometBFT's own genesis. It is plain JSON
so that operators can read and diff it; keys and certificates are base64 / PEM text.

Shape (all fields required unless marked):

    {
      "chain_id": "gentorrent-devnet",
      "genesis_time_ms": 1764000000000,
      "validators": [
        {"name": "v0", "public_key": "<base64 Ed25519, 32 B>", "power": 10,
         "address": "127.0.0.1:7000", "tls_cert_pem": "-----BEGIN CERTIFICATE-----..."}
      ],
      "app_state": {"registry": {"lease_s": 300}}   (optional JSON object, given to InitChain)
    }

`app_state.registry.lease_s` (optional; default and bounds in `config.REGISTRY`) is how long a
node's registration lasts without renewal: the application expires records with it, and nodes
read it here to know how often to renew (ARCHITECTURE.md §3.1).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gentorrent.config import REGISTRY
from gentorrent.ledger.chain import Validator, ValidatorSet
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, node_id_of

GENESIS_FILE = "genesis.json"
MAX_GENESIS_BYTES = 4 * 1024 * 1024
MAX_CHAIN_ID_CHARS = 50  # CometBFT's limit
MAX_VALIDATOR_POWER = 2**60  # well below CometBFT's MaxTotalVotingPower (2^63 - 1) / 8


class GenesisError(ValueError):
    """A genesis file is malformed."""


@dataclass(frozen=True)
class GenesisValidator:
    name: str
    public_key: bytes  # Ed25519 raw 32 bytes
    power: int
    address: str  # host:port of the verifier's gRPC/TLS endpoint
    tls_cert_pem: bytes
    audit_key: bytes = b""  # X25519: users seal audits of real replies to it (optional; gentorrent/audits.py)

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.public_key)

    @property
    def cometbft_address(self) -> bytes:
        """CometBFT's validator address: the first 20 bytes of SHA-256 of the public key."""
        return hashlib.sha256(self.public_key).digest()[:20]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "public_key": base64.b64encode(self.public_key).decode(),
            "power": self.power,
            "address": self.address,
            "tls_cert_pem": self.tls_cert_pem.decode(),
            **({"audit_key": base64.b64encode(self.audit_key).decode()} if self.audit_key else {}),
        }

    @classmethod
    def from_json(cls, obj: Any) -> "GenesisValidator":
        if not isinstance(obj, dict):
            raise GenesisError("a validator must be a JSON object")
        _only_keys(obj, {"name", "public_key", "power", "address", "tls_cert_pem", "audit_key"}, "validator")
        public_key = _key(obj, "public_key")
        power = obj.get("power")
        if not isinstance(power, int) or isinstance(power, bool) or not 0 < power <= MAX_VALIDATOR_POWER:
            raise GenesisError(f"validator power must be an integer in 1..{MAX_VALIDATOR_POWER}")
        return cls(
            name=_str(obj, "name"),
            public_key=public_key,
            power=power,
            address=_str(obj, "address"),
            tls_cert_pem=_str(obj, "tls_cert_pem").encode(),
            audit_key=_key(obj, "audit_key") if "audit_key" in obj else b"",
        )


def _key(obj: dict, name: str) -> bytes:
    """A validator's 32-byte key field, base64."""
    try:
        key = base64.b64decode(_str(obj, name), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GenesisError(f"validator {name} is not base64: {exc}") from exc
    if len(key) != PUBLIC_KEY_BYTES:
        raise GenesisError(f"validator {name} must be {PUBLIC_KEY_BYTES} bytes, got {len(key)}")
    return key


@dataclass(frozen=True)
class Genesis:
    chain_id: str
    genesis_time_ms: int
    validators: tuple[GenesisValidator, ...]
    app_state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.chain_id or len(self.chain_id) > MAX_CHAIN_ID_CHARS:
            raise GenesisError(f"chain_id must be 1..{MAX_CHAIN_ID_CHARS} characters")
        if self.genesis_time_ms < 0:
            raise GenesisError("genesis_time_ms must be >= 0")
        if not self.validators:
            raise GenesisError("a genesis needs at least one validator")
        keys = [v.public_key for v in self.validators]
        if len(set(keys)) != len(keys):
            raise GenesisError("duplicate validator public key")
        lease_ms_of(self.app_state)  # a bad lease stops here, not in every node's InitChain

    @property
    def lease_ms(self) -> int:
        """How long a registration lasts without renewal on this chain."""
        return lease_ms_of(self.app_state)

    def validator_set(self) -> ValidatorSet:
        """The consensus committee, in genesis order (vote indices refer to it)."""
        return ValidatorSet([Validator(v.public_key, v.power) for v in self.validators])

    @property
    def total_power(self) -> int:
        return sum(v.power for v in self.validators)

    def app_state_bytes(self) -> bytes:
        """What InitChain receives: the canonical JSON of `app_state`."""
        return json.dumps(self.app_state, sort_keys=True, separators=(",", ":")).encode()

    def to_json(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id,
            "genesis_time_ms": self.genesis_time_ms,
            "validators": [v.to_json() for v in self.validators],
            "app_state": self.app_state,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> "Genesis":
        if len(text) > MAX_GENESIS_BYTES:
            raise GenesisError(f"genesis file larger than {MAX_GENESIS_BYTES} bytes")
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GenesisError(f"genesis is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise GenesisError("genesis must be a JSON object")
        _only_keys(obj, {"chain_id", "genesis_time_ms", "validators", "app_state"}, "genesis")
        time_ms = obj.get("genesis_time_ms")
        if not isinstance(time_ms, int) or isinstance(time_ms, bool):
            raise GenesisError("genesis_time_ms must be an integer")
        validators = obj.get("validators")
        if not isinstance(validators, list):
            raise GenesisError("validators must be a list")
        app_state = obj.get("app_state", {})
        if not isinstance(app_state, dict):
            raise GenesisError("app_state must be a JSON object")
        return cls(
            chain_id=_str(obj, "chain_id"),
            genesis_time_ms=time_ms,
            validators=tuple(GenesisValidator.from_json(v) for v in validators),
            app_state=app_state,
        )

    @classmethod
    def load(cls, path: Path) -> "Genesis":
        path = Path(path)
        if path.is_dir():
            path = path / GENESIS_FILE
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise GenesisError(f"cannot read genesis {path}: {exc}") from exc
        return cls.loads(data)

    def save(self, path: Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / GENESIS_FILE
        path.write_text(self.dumps())


def lease_ms_of(app_state: Any) -> int:
    """The registration lease of a genesis app_state, in ms (the one reading of it, for the
    application's InitChain and for every node that renews)."""
    registry = app_state.get("registry", {}) if isinstance(app_state, dict) else {}
    if not isinstance(registry, dict) or set(registry) - {"lease_s"}:
        raise GenesisError('app_state.registry must be an object with at most the key "lease_s"')
    lease_s = registry.get("lease_s", REGISTRY.lease_s)
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or \
            not REGISTRY.min_lease_s <= lease_s <= REGISTRY.max_lease_s:
        raise GenesisError(f"app_state.registry.lease_s must be a number of seconds in "
                           f"{REGISTRY.min_lease_s:g}..{REGISTRY.max_lease_s:g}")
    return int(lease_s * 1000)


def _str(obj: dict, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise GenesisError(f"{key} must be a non-empty string")
    return value


def _only_keys(obj: dict, allowed: set[str], what: str) -> None:
    unknown = set(obj) - allowed
    if unknown:
        raise GenesisError(f"unknown {what} field(s): {sorted(unknown)}")
