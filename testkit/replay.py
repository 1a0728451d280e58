"""Replay recorded blocks into a fresh registry application, in a process whose own settings
differ from its peers' (tests/test_chain_params.py).

    python -m testkit.replay CHAIN.json OVERRIDES.json

CHAIN.json: {"chain_id", "genesis_time_ms", "validators": [[public key hex, power]...],
"app_state": the genesis' app_state, "blocks": [{"height", "time_ms", "proposer", "hash", "txs":
[hex...]}]}. OVERRIDES.json: {"EPOCHS": {"score_tolerance": 0.01}, "REPUTATION": {...}, ...}
replaces this process's `gentorrent.config` defaults before anything else reads them, as another
build, or a deployment that edited config.py, would have them (a field the dataclass does not
have is skipped, so one file serves every version of the code). Prints one JSON line: the app
hash (hex) after InitChain and after each block.

The same blocks, the same genesis: two processes that compute different hashes have let a
process-local number into the replicated rules.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import gentorrent.config as cfg


def override_defaults(overrides: dict[str, dict]) -> None:
    """Replace config singletons before any other module imports them."""
    for name, changes in overrides.items():
        current = getattr(cfg, name, None)
        if current is None or not dataclasses.is_dataclass(current):
            continue
        known = {f.name for f in dataclasses.fields(current)}
        setattr(cfg, name, dataclasses.replace(current, **{k: v for k, v in changes.items() if k in known}))


def replay(chain: dict, db: Path) -> list[str]:
    from verifier.abci.app import RegistryApp
    from verifier.abci.interface import BlockContext, ValidatorInfo

    app = RegistryApp(db)
    try:
        validators = [ValidatorInfo(bytes.fromhex(k), p) for k, p in chain["validators"]]
        app_state = json.dumps(chain["app_state"], sort_keys=True, separators=(",", ":")).encode()
        hashes = [app.init_chain(chain["chain_id"], validators, app_state, chain["genesis_time_ms"]).hex()]
        for b in chain["blocks"]:
            ctx = BlockContext(b["height"], b["time_ms"], bytes.fromhex(b["proposer"]), bytes.fromhex(b["hash"]))
            hashes.append(app.finalize_block([bytes.fromhex(t) for t in b["txs"]], ctx).app_hash.hex())
            app.commit()
        return hashes
    finally:
        app.close()


def main(argv: list[str]) -> int:
    chain_file, overrides_file = Path(argv[0]), Path(argv[1])
    override_defaults(json.loads(overrides_file.read_text()))
    print(json.dumps(replay(json.loads(chain_file.read_text()), overrides_file.with_suffix(".sqlite"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
