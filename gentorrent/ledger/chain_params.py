"""The parameters of the committee's replicated rules: fixed by the genesis, read from chain state.

Every number the registry application's rules depend on is here and only here: the registry's
rules (the registration lease, the proof of work a registration carries, the caps on relays per
IPv4 /24 and IPv6 /48, the registrations one block may carry, whether paths take one relay per
/16 or /32), the verification epochs' probe-set size, score tolerance, phase deadlines and history,
and the reputation update. A committee's genesis sets them (`app_state`, plain JSON; a field
left out takes the default of its dataclass in gentorrent.config, and `gt-verifier init` writes
every field out), InitChain stores them in the state's meta section (so the app hash commits to
them and a light client can prove them), and the rules read them from the state they apply to.
A member's own settings (its config.toml, its command line, the numbers its build defaults to)
never reach them: members configured differently still compute one state
(tests/test_chain_params.py).

    "app_state": {
      "registry":   {"lease_s": 7200, "pow_bits": 18, "pow_memory_kib": 256, "relays_per_24": 4,
                     "relays_per_48": 4, "distinct_path_prefixes": true, "registrations_per_block": 200},
      "epochs":     {"max_probed_nodes": 64, "score_tolerance": 0.05, "election_timeout_ms": 15000, ...},
      "reputation": {"alpha": 0.4, "beta": 0.6, "window": 5, ...}
    }
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any

from gentorrent import settings
from gentorrent.config import EpochParams, RegistryParams, ReputationParams
from gentorrent.ledger.pow import MAX_BITS, PowParams

__all__ = ["ChainParams", "ChainParamsError", "RegistryRules", "SECTIONS"]

#: app_state sections that are dataclasses of gentorrent.config (the registry's lease is in seconds)
SECTIONS: dict[str, type] = {"epochs": EpochParams, "reputation": ReputationParams}
_REGISTRY = RegistryParams()  # the lease's default and bounds (a class default, never a process's)


class ChainParamsError(ValueError):
    """A genesis app_state (or a stored copy of it) that does not give valid parameters."""


@dataclass(frozen=True)
class RegistryRules:
    """The registry's rules (`app_state.registry`): one reading for the application (leases,
    proofs of work, prefix caps, the per-block cap) and for every node (how often to renew, the
    work to do before registering, path choice). A key a genesis leaves out switches its rule
    off (a test chain); `gt-verifier init` writes `production()` or, for a committee on
    loopback, `loopback()`."""

    lease_ms: int = int(_REGISTRY.lease_s * 1000)  # a registration lasts this long without renewal
    pow: PowParams = PowParams()  # the proof of work a registration carries (gentorrent.ledger.pow)
    relays_per_24: int = 0  # relays one IPv4 /24 may register (0: no cap)
    relays_per_48: int = 0  # relays one IPv6 /48 may register (0: no cap)
    distinct_path_prefixes: bool = False  # a path takes at most one relay per IPv4 /16, IPv6 /32
    # registrations one block may carry (0: no cap): their proofs of work are what a Byzantine
    # proposer could make every member verify at full cost
    registrations_per_block: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"lease_s": self.lease_ms / 1000, "pow_bits": self.pow.bits, "pow_memory_kib": self.pow.memory_kib,
                "relays_per_24": self.relays_per_24, "relays_per_48": self.relays_per_48,
                "distinct_path_prefixes": self.distinct_path_prefixes,
                "registrations_per_block": self.registrations_per_block}

    @classmethod
    def production(cls, lease_s: float | None = None) -> "RegistryRules":
        """What `gt-verifier init` writes for a real deployment (RegistryParams' class defaults,
        never a process's settings)."""
        return cls(_lease_ms(_REGISTRY.lease_s if lease_s is None else lease_s),
                   PowParams(_REGISTRY.pow_bits, _REGISTRY.pow_memory_kib), _REGISTRY.relays_per_24,
                   _REGISTRY.relays_per_48, True, _REGISTRY.registrations_per_block)

    @classmethod
    def loopback(cls, lease_s: float | None = None) -> "RegistryRules":
        """The devnet's: every node on 127.0.0.1 (one /24, one /16), so no prefix rule, and a light
        proof of work (the rule runs, registering stays fast)."""
        return dataclasses.replace(cls.production(lease_s),
                                   pow=PowParams(_REGISTRY.loopback_pow_bits, _REGISTRY.pow_memory_kib),
                                   relays_per_24=0, relays_per_48=0, distinct_path_prefixes=False)

    @classmethod
    def from_json(cls, registry: Any) -> "RegistryRules":
        """The rules of `app_state.registry`; ChainParamsError naming the key that is wrong."""
        if not isinstance(registry, dict) or set(registry) - _RULE_KEYS:
            raise ChainParamsError(f"app_state.registry must be an object with at most the keys {sorted(_RULE_KEYS)}")

        def count(key: str, limit: int) -> int:
            value = registry.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
                raise ChainParamsError(f"app_state.registry.{key} must be an integer in 0..{limit}")
            return value

        flag = registry.get("distinct_path_prefixes", False)
        if not isinstance(flag, bool):
            raise ChainParamsError("app_state.registry.distinct_path_prefixes must be true or false")
        memory = registry.get("pow_memory_kib", PowParams.memory_kib)
        if isinstance(memory, bool) or not isinstance(memory, int):
            raise ChainParamsError("app_state.registry.pow_memory_kib must be an integer")
        try:
            pow_params = PowParams(count("pow_bits", MAX_BITS), memory)
        except ValueError as exc:
            raise ChainParamsError(f"app_state.registry: {exc}") from exc
        return cls(_lease_ms(registry.get("lease_s", _REGISTRY.lease_s)), pow_params,
                   count("relays_per_24", 1 << 16), count("relays_per_48", 1 << 16), flag,
                   count("registrations_per_block", 1 << 20))


_RULE_KEYS = {"lease_s", "pow_bits", "pow_memory_kib", "relays_per_24", "relays_per_48", "distinct_path_prefixes",
              "registrations_per_block"}


@dataclass(frozen=True)
class ChainParams:
    """What the replicated rules read: one frozen value per chain."""

    registry: RegistryRules = field(default_factory=RegistryRules)
    epochs: EpochParams = field(default_factory=EpochParams)
    reputation: ReputationParams = field(default_factory=ReputationParams)

    @property
    def lease_ms(self) -> int:
        """How long a registration lasts without renewal (the registry's rule)."""
        return self.registry.lease_ms

    @classmethod
    def from_app_state(cls, app_state: Any) -> "ChainParams":
        """The parameters a genesis app_state sets; ChainParamsError (naming the field) if any is
        unknown, of the wrong type or out of bounds."""
        if not isinstance(app_state, dict):
            raise ChainParamsError("app_state must be a JSON object")
        # ("catalogue": the models listed at genesis, state rather than a parameter: ledger.catalogue)
        unknown = set(app_state) - {"registry", "catalogue", *SECTIONS}
        if unknown:
            raise ChainParamsError(f"app_state: unknown section(s) {sorted(unknown)} (known: registry, "
                                   f"catalogue, {', '.join(SECTIONS)})")
        try:
            parsed = settings.parse({k: v for k, v in app_state.items() if k in SECTIONS}, SECTIONS, "app_state")
        except settings.ConfigError as exc:
            raise ChainParamsError(str(exc)) from exc
        return cls(RegistryRules.from_json(app_state.get("registry", {})), parsed["epochs"], parsed["reputation"])

    def to_app_state(self) -> dict[str, Any]:
        """Every parameter written out (what `gt-verifier init` puts in a genesis)."""
        return {"registry": self.registry.to_json(),
                **{name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}}

    def encode(self) -> bytes:
        """The canonical JSON the state's meta section holds (and the /params query answers)."""
        return self._encoded

    @functools.cached_property
    def _encoded(self) -> bytes:  # every app hash hashes it: encoded once per value
        return json.dumps(self.to_app_state(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "ChainParams":
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ChainParamsError(f"chain parameters are not JSON: {exc}") from exc
        return cls.from_app_state(obj)


def _lease_ms(lease_s: Any) -> int:
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or \
            not _REGISTRY.min_lease_s <= lease_s <= _REGISTRY.max_lease_s:
        raise ChainParamsError(f"app_state.registry.lease_s must be a number of seconds in "
                               f"{_REGISTRY.min_lease_s:g}..{_REGISTRY.max_lease_s:g}")
    return int(lease_s * 1000)
