"""Embedded Tendermint committee throughput, shipped and fast timeouts side by side: ONE JSON line.

Mode: 4 separate `gt-verifier` processes (RegistryApp on SQLite, WAL + fsync'd sign state)
talking gRPC over TLS on 127.0.0.1, run twice: with the shipped timeouts (`CONSENSUS`, what
`gt-verifier init` writes by default: 1 s commit wait after every block) and with the fast ones
(`CONSENSUS_FAST`, `--timeouts fast`: no commit wait, for tests and this loopback benchmark).
Goal (ARCHITECTURE.md §7): >= 20 heights/s, which only the fast configuration can reach: the shipped
one waits `commit_s` after each decision by design (time for slow validators' precommits to
arrive and go into the next block's last commit).

Phase 1, idle: heights per second over `--idle-s` seconds, and the block interval (time
between consecutive block timestamps) p50 / p99.
Phase 2, load: `--txs` user registrations (distinct identities, pre-built) submitted
round-robin to the four verifiers, `--inflight` at a time; transactions per second (first
submit -> last commit) and commit latency per transaction (submit -> timestamp of the next
block, which the next proposer stamps right after the commit) p50 / p99.

    .venv/bin/python bench/consensus.py [--idle-s 10] [--txs 600] [--inflight 16] [--only shipped|fast] [--png F]
    .venv/bin/python bench/consensus.py --tiny    # seconds: what make test runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gentorrent.config import CONSENSUS, CONSENSUS_FAST  # noqa: E402
from gentorrent.crypto.keys import Identity, OnionKey  # noqa: E402
from gentorrent.crypto.tls import connect  # noqa: E402
from gentorrent.ledger.genesis import loopback_pow_nonce  # noqa: E402
from gentorrent.wire import gentorrent_pb2 as pb  # noqa: E402
from gentorrent.wire import gentorrent_pb2_grpc as rpc  # noqa: E402
from testkit.committee import free_base_port  # noqa: E402
from gentorrent.ledger import txs as txlib  # noqa: E402
from gentorrent.ledger.chain import Block, sha256  # noqa: E402
from gentorrent.ledger.genesis import Genesis  # noqa: E402




async def stubs(genesis: Genesis):
    out = []
    for v in genesis.validators:
        ch = await connect(v.address, v.tls_cert_pem, timeout=30)
        out.append((ch, rpc.VerifierStub(ch)))
    return out


async def wait_height(stub, height: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await stub.Status(pb.Empty(), timeout=5)
        if st.height >= height:
            return st.height
        await asyncio.sleep(0.05)
    raise RuntimeError(f"committee stuck below height {height}")


async def blocks(stub, start: int, end: int) -> list[Block]:
    out = []
    h = start
    while h <= end:
        got = 0
        async for item in stub.GetBlocks(pb.BlockRangeRequest(from_height=h, to_height=end), timeout=30):
            out.append(Block.decode(item.block))
            got += 1
        if not got:
            break
        h += got
    return out


def registrations(n: int, chain_id: str) -> list[bytes]:
    """n user registrations of distinct identities, signed for the committee of `chain_id`."""
    out = []
    for k in range(n):
        ident = Identity.generate()
        out.append(txlib.register_user(ident, f"127.0.0.1:{20000 + k}", OnionKey.generate().public_key,
                                       "bench", 1, chain_id=chain_id,
                                       pow_nonce=loopback_pow_nonce(chain_id, ident.public_key)))
    return out


CONFIGS = {"shipped": ("default", CONSENSUS), "fast": ("fast", CONSENSUS_FAST)}


async def run(args, config: str) -> dict:
    """One committee with one timeout configuration: its figures and the raw samples."""
    tmp = Path(tempfile.mkdtemp(prefix="gt-bench-consensus-"))
    init = subprocess.run([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "init",
                           "--validators", "4", "--out", str(tmp), "--base-port", str(free_base_port(4)),
                           "--timeouts", CONFIGS[config][0], "--chain-id", "bench"], cwd=ROOT, capture_output=True,
                          text=True)
    if init.returncode:
        raise RuntimeError(init.stderr)
    homes = [tmp / f"v{i}" for i in range(4)]
    genesis = Genesis.load(homes[0])
    procs = [subprocess.Popen([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "start",
                               "--home", str(h)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for h in homes]
    try:
        txs = registrations(args.txs, genesis.chain_id)
        conns = await stubs(genesis)
        stub0 = conns[0][1]
        await wait_height(stub0, 5, timeout=120)

        # phase 1: idle heights/s
        h0 = (await stub0.Status(pb.Empty(), timeout=5)).height
        t0 = time.monotonic()
        await asyncio.sleep(args.idle_s)
        h1 = (await stub0.Status(pb.Empty(), timeout=5)).height
        t1 = time.monotonic()
        idle_blocks = await blocks(stub0, h0, h1)
        stamps = np.array([b.header.time_ms for b in idle_blocks], dtype=float)
        intervals = np.diff(stamps)

        # phase 2: load
        submitted: dict[bytes, float] = {}
        queue = list(enumerate(txs))
        start_h = (await stub0.Status(pb.Empty(), timeout=5)).height

        async def worker() -> None:
            while queue:
                k, tx = queue.pop()
                submitted[sha256(tx)] = time.time()
                reply = await conns[k % 4][1].SubmitTx(pb.TxRequest(tx=tx), timeout=10)
                if reply.code != 0:
                    raise RuntimeError(f"tx refused: {reply.log}")

        load_t0 = time.time()
        await asyncio.gather(*(worker() for _ in range(args.inflight)))
        committed: dict[bytes, float] = {}
        deadline = time.monotonic() + 120
        h = start_h + 1
        while len(committed) < len(txs) and time.monotonic() < deadline:
            top = await wait_height(stub0, h)
            bl = await blocks(stub0, h, top)
            for b, nxt in zip(bl, bl[1:]):
                for tx in b.txs:
                    committed[sha256(tx)] = nxt.header.time_ms / 1000
            h = bl[-1].height if len(bl) > 1 else h
            await asyncio.sleep(0.1)
        latencies = np.array([(committed[k] - submitted[k]) * 1000 for k in committed])
        load_end = max(committed.values()) if committed else time.time()
        for ch, _ in conns:
            await ch.close()
        t = CONFIGS[config][1]
        return {
            "timeouts": {"propose_s": t.propose_s, "prevote_s": t.prevote_s, "precommit_s": t.precommit_s,
                         "commit_s": t.commit_s, "gossip_s": t.gossip_s},
            "heights_per_s": round((h1 - h0) / (t1 - t0), 2),
            "block_interval_ms_p50": round(float(np.percentile(intervals, 50)), 1),
            "block_interval_ms_p99": round(float(np.percentile(intervals, 99)), 1),
            "txs": len(txs),
            "txs_committed": len(committed),
            "tps": round(len(committed) / max(1e-9, load_end - load_t0), 1),
            "tx_commit_latency_ms_p50": round(float(np.percentile(latencies, 50)), 1) if len(latencies) else None,
            "tx_commit_latency_ms_p99": round(float(np.percentile(latencies, 99)), 1) if len(latencies) else None,
            "_samples": (intervals, latencies),
        }
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["rm", "-rf", str(tmp)])


def plot(path: str, samples: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """CDFs of the block interval (idle) and of the transaction commit latency (load), per
    configuration (log scale: the shipped one is about two orders of magnitude slower)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for config, (intervals, latencies) in samples.items():
        for ax, data in ((axes[0], intervals), (axes[1], latencies)):
            xs = np.sort(data)
            ax.plot(xs, np.arange(1, len(xs) + 1) / max(1, len(xs)), label=config)
    for ax, title in ((axes[0], "block interval, idle (ms)"), (axes[1], "tx commit latency, under load (ms)")):
        ax.set_xscale("log")
        ax.set_xlabel(title)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("4 gt-verifier processes, loopback: shipped vs fast timeouts")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def run_all(args) -> dict:
    out = {"bench": "consensus",
           "mode": "4 gt-verifier processes, gRPC/TLS on 127.0.0.1, RegistryApp+SQLite",
           "cpu_cores": os.cpu_count(), "goal_heights_per_s": 20}
    samples = {}
    for config in ([args.only] if args.only else list(CONFIGS)):
        result = await run(args, config)
        samples[config] = result.pop("_samples")
        out[config] = result
    if "shipped" in out and "fast" in out and out["fast"]["heights_per_s"]:
        out["shipped_over_fast_heights"] = round(out["shipped"]["heights_per_s"] / out["fast"]["heights_per_s"], 3)
    if args.png:
        plot(args.png, samples)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--txs", type=int, default=600)
    ap.add_argument("--inflight", type=int, default=16)
    ap.add_argument("--only", choices=list(CONFIGS), help="run one configuration (default: both)")
    ap.add_argument("--png", help="also write CDFs of block interval and tx latency to this PNG")
    ap.add_argument("--tiny", action="store_true", help="seconds: the fast configuration, 1 s idle, 20 txs")
    args = ap.parse_args()
    if args.tiny:
        args.idle_s, args.txs, args.inflight, args.only = 1.0, 20, 8, "fast"
    print(json.dumps(asyncio.run(run_all(args))))


if __name__ == "__main__":
    main()
