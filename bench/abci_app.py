"""Registry app cost per block (what the consensus engine's heights/s budget has to include):
prints ONE JSON line.

Registers `users` user nodes in blocks of `block_txs` transactions, then measures: CheckTx
per transaction, FinalizeBlock + Commit of a full block and of an empty block (p50 / p99, ms,
with the registry at its final size), and a proven relay sample (size, time).

    .venv/bin/python bench/abci_app.py [USERS]      # default 1000
    .venv/bin/python bench/abci_app.py --tiny       # 50 users: what make test runs
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.ledger import txs
from verifier.abci.app import RegistryApp
from verifier.abci.interface import BlockContext, ValidatorInfo

USERS = 50 if sys.argv[1:] == ["--tiny"] else int(sys.argv[1]) if len(sys.argv) > 1 else 1000
BLOCK_TXS = 100


def main() -> None:
    validator = Identity.from_seed(bytes(32))
    onion = OnionKey.generate().public_key
    raw = []
    for i in range(USERS):
        ident = Identity.from_seed(i.to_bytes(4, "big") * 8)
        raw.append(txs.register_user(ident, f"10.0.{i // 250}.{i % 250 + 1}:7000", onion, "eu", 1,
                                     chain_id="bench"))
    with tempfile.TemporaryDirectory() as tmp:
        app = RegistryApp(Path(tmp) / "state.db")
        app.init_chain("bench", [ValidatorInfo(validator.public_key, 1)], b"", 0)
        t0 = time.perf_counter()
        assert all(app.check_tx(t).ok for t in raw)
        check_us = (time.perf_counter() - t0) / len(raw) * 1e6
        height, full_ms = 0, []
        for start in range(0, len(raw), BLOCK_TXS):
            height += 1
            t0 = time.perf_counter()
            app.finalize_block(raw[start:start + BLOCK_TXS], BlockContext(height, height * 1000, validator.public_key))
            app.commit()
            full_ms.append((time.perf_counter() - t0) * 1e3)
        empty_ms = []
        for _ in range(50):
            height += 1
            t0 = time.perf_counter()
            app.finalize_block([], BlockContext(height, height * 1000, validator.public_key))
            app.commit()
            empty_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        value = app.query("/proof/relays/eu", bytes(8 * 18)).value
        query_ms = (time.perf_counter() - t0) * 1e3
        app.close()
    print(json.dumps({
        "bench": "abci_app", "users": USERS, "block_txs": BLOCK_TXS,
        "check_tx_us": round(check_us, 1),
        "full_block_ms_p50": round(float(np.percentile(full_ms, 50)), 2),
        "full_block_ms_p99": round(float(np.percentile(full_ms, 99)), 2),
        "empty_block_ms_p50": round(float(np.percentile(empty_ms, 50)), 2),
        "empty_block_ms_p99": round(float(np.percentile(empty_ms, 99)), 2),
        "sample_bytes": len(value), "sample_query_ms": round(query_ms, 2),
    }))


if __name__ == "__main__":
    main()
