"""The committee of every height: the genesis set, then each block's validator updates two
heights later (pure).

CometBFT's rule: the updates FinalizeBlock returns for block H change the set that signs block
H + 2. Block H + 1 is already being agreed on when H is executed (its header names H's set as
`validators_hash` and the set of H + 2 as `next_validators_hash`, which the updates of H fix),
so every validator knows the committee of a height before it starts it, and a light client that
trusts header H knows, from its `next_validators_hash`, which set signs H + 1.

`record` is idempotent for a height (a node that crashed between executing a block and
committing the application executes it again on start: the same updates must come back, or
the application is not deterministic and the node must stop).
"""

from __future__ import annotations

import bisect

from gentorrent.ledger.chain import ValidatorSet

#: updates of block H apply from H + DELAY on
DELAY = 2

Updates = tuple[tuple[bytes, int], ...]  # (public key, power); power 0 removes


class ValidatorHistory:
    def __init__(self, genesis: ValidatorSet) -> None:
        self._sets: list[ValidatorSet] = [genesis]
        self._starts: list[int] = [genesis.start_height]
        self._updates: dict[int, Updates] = {}  # height -> its non-empty updates
        self._last = 0  # the last height recorded

    def at(self, height: int) -> ValidatorSet:
        """The set that signs block `height` (known up to two heights past the last executed)."""
        k = bisect.bisect_right(self._starts, height) - 1
        if k < 0:
            raise ValueError(f"no committee before height {self._starts[0]}")
        return self._sets[k]

    def record(self, height: int, updates: Updates) -> ValidatorSet | None:
        """Block `height` returned `updates`: the new set from height + 2 (None if unchanged).
        Raises ValueError for updates that are invalid, out of order, or differ from those the
        same height returned before."""
        updates = tuple((bytes(k), int(p)) for k, p in updates)
        if height <= self._last:
            if self._updates.get(height, ()) != updates:
                raise ValueError(f"block {height} returned other validator updates than before: "
                                 "the application is not deterministic")
            return None
        self._last = height
        if not updates:
            return None
        self._updates[height] = updates
        effective = height + DELAY
        new = self.at(effective).updated(list(updates), effective)
        if self._starts[-1] >= effective:
            raise ValueError(f"a committee already starts at height {self._starts[-1]}")
        self._sets.append(new)
        self._starts.append(effective)
        return new

    def changes(self) -> list[tuple[int, ValidatorSet]]:
        """(first height, set) of every committee so far, genesis first."""
        return list(zip(self._starts, self._sets))

    @classmethod
    def load(cls, genesis: ValidatorSet, stored: "list[tuple[int, Updates]]") -> "ValidatorHistory":
        """The history of a node that restarts: genesis, then the updates its block store kept."""
        history = cls(genesis)
        for height, updates in stored:
            history.record(height, updates)
        return history
