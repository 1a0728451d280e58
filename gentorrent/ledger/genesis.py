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
      "app_state": {"registry": {"lease_s": 300}, "epochs": {...}, "reputation": {...}}
    }

`app_state` (optional JSON object, given to InitChain) holds the parameters of the committee's
replicated rules (gentorrent/ledger/chain_params.py). `app_state.registry` holds the registry's
rules (`RegistryRules`; every key optional): `lease_s` (default and bounds in `config.REGISTRY`)
is how long a node's registration lasts without renewal: the application expires records with
it, and nodes read it here to know how often to renew (ARCHITECTURE.md §3.1); `pow_bits` and
`pow_memory_kib` the proof of work a registration carries (gentorrent.ledger.pow);
`relays_per_24` and `relays_per_48` how many relays one IPv4 /24 or IPv6 /48 may register (0: no
cap); `distinct_path_prefixes` whether a path takes at most one relay per IPv4 /16 or IPv6 /32;
`registrations_per_block` how many registrations one block may carry. A key left out switches
its rule off (a test chain); `gt-verifier init` writes the production rules, or the devnet's for
a committee on loopback.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gentorrent.ledger.chain import Validator, ValidatorSet
from gentorrent.ledger.chain_params import ChainParams, ChainParamsError, RegistryRules
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
        self.params  # noqa: B018 - a bad parameter stops here, not in every node's InitChain
        catalogue_of(self.app_state)  # and so does a bad catalogue

    @property
    def params(self) -> ChainParams:
        """The parameters of this chain's replicated rules."""
        try:
            return ChainParams.from_app_state(self.app_state)
        except ChainParamsError as exc:
            raise GenesisError(str(exc)) from exc

    @property
    def lease_ms(self) -> int:
        """How long a registration lasts without renewal on this chain."""
        return self.params.lease_ms

    @property
    def rules(self) -> RegistryRules:
        """The registry's rules on this chain (renewals, proofs of work, path choice)."""
        return self.params.registry

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


def loopback_pow_nonce(chain_id: str, public_key: bytes) -> int:
    """The proof of work of a key on a committee `gt-verifier init` made on loopback (what tests
    and benchmarks that sign registrations by hand must carry)."""
    from gentorrent.ledger.pow import solve

    return solve(RegistryRules.loopback().pow, chain_id, public_key)


def lease_ms_of(app_state: Any) -> int:
    """The registration lease of a genesis app_state, in ms."""
    try:
        return ChainParams.from_app_state(app_state).lease_ms
    except ChainParamsError as exc:
        raise GenesisError(str(exc)) from exc


def catalogue_of(app_state: Any) -> list:
    """The model catalogue a genesis app_state lists (gentorrent.ledger.catalogue); GenesisError
    naming what is wrong."""
    from gentorrent.ledger.catalogue import entries_of_app_state
    from gentorrent.ledger.signed_tx import TxError

    try:
        return entries_of_app_state(app_state)
    except TxError as exc:
        raise GenesisError(str(exc)) from None


def _str(obj: dict, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise GenesisError(f"{key} must be a non-empty string")
    return value


def _only_keys(obj: dict, allowed: set[str], what: str) -> None:
    unknown = set(obj) - allowed
    if unknown:
        raise GenesisError(f"unknown {what} field(s): {sorted(unknown)}")
