"""Entry guards: the few long-lived first hops of a user's paths (pure; time and rng passed in).

A first hop drawn afresh for every path meets a colluder sooner or later: with a share f of
colluding relays and 6 paths every 15 minutes, 1 - (1 - f)^6 of users within one renewal and
nearly all within a day (results/sims/linkability.md). A colluding first hop that knows where it
is (a guard does: its client builds every path through it) names its predecessor as the asker.
Tor's answer, taken here: a user keeps a short ordered list of guards for weeks, and the first
usable guard of the list is the first hop of every path, so a colluder sees a user only if it is
one of its guards -- a user is exposed with probability about f per guard it ever uses, not per
path.

Rules (`GuardParams`):

* the list holds `sampled` guards, drawn uniformly among the relays the directory lists (never
  the user itself, never a client-only node: the caller passes relays only), each in a network
  (`prefix`: the /16 or /32 when the genesis asks for distinct path prefixes) no other guard of
  the list is in, so that one operator's block of addresses holds at most one of them;
* a guard is rotated after a lifetime drawn uniformly in [lifetime_min_s, lifetime_max_s] from
  when it was chosen; one missing from the directory for `absent_drop_s` has left and is
  replaced; until then the next guard of the list stands in (a guard that restarts is not
  swapped for a fresh draw, which would expose the user to one more relay);
* the list is the node's own state, kept in its home (`to_json` / `from_json`), so a restart
  keeps the same guards.

The path manager (user_client/paths.py) asks `first_hop` for the guard of a new path and draws
the other hops as before, never in the guard's network.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Protocol

from gentorrent.config import GUARDS, GuardParams

FORMAT = "gentorrent/guards/v1"
MAX_FILE_BYTES = 64 * 1024


class GuardFileError(ValueError):
    """A guard file that cannot be read back."""


class RelayRecord(Protocol):
    """What a guard is drawn from (a ledger.sections.UserRecord)."""

    @property
    def node_id_hex(self) -> str: ...

    address: str


@dataclass
class Guard:
    node_id: str  # hex
    address: str  # where it was when chosen: the network it belongs to
    chosen_s: float  # wall clock
    expires_s: float  # rotated at this time
    missing_since_s: float | None = None  # first seen missing from the directory


class GuardSet:
    """A user's ordered entry guards."""

    def __init__(self, params: GuardParams = GUARDS, guards: Iterable[Guard] = ()) -> None:
        if params.sampled < 1 or not 0 < params.lifetime_min_s <= params.lifetime_max_s or params.absent_drop_s < 0:
            raise ValueError("guards: sampled >= 1, 0 < lifetime_min_s <= lifetime_max_s, absent_drop_s >= 0")
        self.params = params
        self.guards: list[Guard] = list(guards)[: params.sampled]

    def refresh(self, relays: Iterable[RelayRecord], self_id: str, now: float, rng: random.Random,
                prefix: Callable[[str], str] = lambda address: address) -> bool:
        """Rotate, drop the ones that left, top the list up from `relays`; whether it changed."""
        listed = {r.node_id_hex: r for r in relays if r.node_id_hex != self_id}
        before = [asdict(g) for g in self.guards]
        kept = []
        for g in self.guards:
            if now >= g.expires_s:
                continue  # its lifetime is over: rotated
            if g.node_id in listed:
                g.missing_since_s = None
                g.address = listed[g.node_id].address
            elif g.missing_since_s is None:
                g.missing_since_s = now
            elif now - g.missing_since_s >= self.params.absent_drop_s:
                continue  # gone for good
            kept.append(g)
        taken = {prefix(g.address) for g in kept}
        ids = {g.node_id for g in kept}
        candidates = [r for r in listed.values() if r.node_id_hex not in ids]
        rng.shuffle(candidates)
        for r in candidates:
            if len(kept) >= self.params.sampled:
                break
            if prefix(r.address) in taken:
                continue
            taken.add(prefix(r.address))
            life = rng.uniform(self.params.lifetime_min_s, self.params.lifetime_max_s)
            kept.append(Guard(r.node_id_hex, r.address, now, now + life))
        self.guards = kept
        return [asdict(g) for g in kept] != before

    def first_hop(self, usable: Callable[[str], bool] = lambda node_id: True) -> str | None:
        """The first guard of the list that the directory lists and `usable` accepts (a guard the
        path manager suspects is skipped: the next one stands in); None when there is none."""
        return next((g.node_id for g in self.guards if g.missing_since_s is None and usable(g.node_id)), None)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "guards": [asdict(g) for g in self.guards]}, indent=1)

    @classmethod
    def from_json(cls, text: str, params: GuardParams = GUARDS) -> "GuardSet":
        """A guard file read back; GuardFileError says what is wrong with it."""
        if len(text) > MAX_FILE_BYTES:
            raise GuardFileError(f"the guard file is {len(text)} bytes, more than {MAX_FILE_BYTES}")
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise GuardFileError(f"not a guard file of format {FORMAT}")
            guards = [_guard(g) for g in data["guards"]]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise exc if isinstance(exc, GuardFileError) else GuardFileError(f"malformed guard file: {exc}") from exc
        return cls(params, guards)


def _guard(item: dict) -> Guard:
    g = Guard(str(item["node_id"]), str(item["address"]), float(item["chosen_s"]), float(item["expires_s"]),
              None if item.get("missing_since_s") is None else float(item["missing_since_s"]))
    bytes.fromhex(g.node_id)  # a node id is hex
    if len(g.node_id) != 64 or g.expires_s < g.chosen_s:
        raise GuardFileError(f"guard {g.node_id[:16]}: a 32-byte node id and an expiry after its choice")
    return g
