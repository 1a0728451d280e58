"""A verifier's home directory and its node configuration.

    config.json      moniker, listen address, timeouts ("default" | "fast"), block limits
    genesis.json     the committee (gentorrent.ledger.genesis.Genesis): shared by every node and client
    identity.key.pem onion.key.pem tls.crt.pem tls.key.pem   (gentorrent.crypto)
    data/            blocks.sqlite app.sqlite cs.wal sign_state.json
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gentorrent.config import CONSENSUS, CONSENSUS_FAST, ConsensusTimeouts
from gentorrent.ledger.genesis import GenesisError

CONFIG_FILE = "config.json"
DATA_DIR = "data"


@dataclass(frozen=True)
class NodeConfig:
    moniker: str
    listen: str
    timeouts: str = "default"  # "default" | "fast"
    max_block_txs: int = 2000
    max_block_bytes: int = 4 * 1024 * 1024 - 64 * 1024
    max_mempool_txs: int = 10_000

    def consensus_timeouts(self) -> ConsensusTimeouts:
        if self.timeouts == "fast":
            return CONSENSUS_FAST
        if self.timeouts == "default":
            return CONSENSUS
        raise GenesisError(f"timeouts must be 'default' or 'fast', not {self.timeouts!r}")

    def save(self, home: Path) -> None:
        (Path(home) / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, home: Path) -> "NodeConfig":
        path = Path(home) / CONFIG_FILE
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise GenesisError(f"cannot read {path}: {exc}") from exc
        if not isinstance(d, dict):
            raise GenesisError(f"{path}: must be a JSON object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise GenesisError(f"{path}: unknown keys {sorted(unknown)}")
        try:
            cfg = cls(**d)
        except TypeError as exc:
            raise GenesisError(f"{path}: {exc}") from exc
        cfg.consensus_timeouts()
        return cfg
