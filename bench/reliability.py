"""Reliability results table: runs fault scenarios, writes results/reliability.md
and prints ONE JSON line.

    .venv/bin/python bench/reliability.py                 # every registered scenario
    .venv/bin/python bench/reliability.py --list          # names and faults only
    .venv/bin/python bench/reliability.py --only link-blackhole --quick
    .venv/bin/python bench/reliability.py --tiny          # one quick scenario: what make test runs

The scenario registry
---------------------
`SCENARIOS` below is the one explicit list of what runs, in order. A scenario is a
`Scenario(name, fault, run)`: `fault` says in words what is injected (a table column), and
`run` is an `async def run(ctx: Context) -> Outcome` that builds its own real processes or
servers on 127.0.0.1, injects the fault (testkit.faultproxy, kill -9 through
devnet.supervisor, ...), drives load, tears everything down, and reports what it saw in
an `Outcome`. To add one: write the coroutine (in this file or imported from where its parts
live) and append a `Scenario` to `SCENARIOS`. Keep `ctx.quick` runs under ~10 s each.

A scenario *survived* when nothing was lost (`lost == 0`, `committed_txs_lost == 0`,
`forks == 0`) and it recovered (`recover_s` is not None, where recovery applies). Fields
that do not apply to a scenario stay None and print as "n/a". A scenario that raises is
reported as a failed row with the exception as its note, and the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "results" / "reliability.md"
TINY_SCENARIO = "relay-drop"  # --tiny: one quick scenario on a real in-process overlay


@dataclass
class Context:
    """What every scenario gets: how long to run, and a seed for anything random."""

    quick: bool = False
    seed: int = 0

    def seconds(self, full: float, quick: float) -> float:
        return quick if self.quick else full


@dataclass
class Outcome:
    """What one scenario observed; None means "does not apply to this scenario"."""

    requests_sent: int | None = None
    answered: int | None = None
    lost: int | None = None  # sent, and neither answered nor failed with a clear error
    failed_clearly: int | None = None  # a clear error (deadline, busy, unavailable) instead of a hang
    committed_txs_lost: int | None = None
    forks: int | None = None
    recover_s: float | None = None  # from the end of the fault to the first success
    note: str = ""
    extra: dict = field(default_factory=dict)

    def survived(self) -> bool:
        nothing_lost = all(v in (None, 0) for v in (self.lost, self.committed_txs_lost, self.forks))
        recovered = self.recover_s is not None or self.requests_sent is None
        return nothing_lost and recovered


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    run: Callable[[Context], Awaitable[Outcome]]


# --------------------------------------------------------------------------- scenarios


async def link_blackhole(ctx: Context) -> Outcome:
    """A real gRPC/TLS server behind the fault proxy; a client calls it at a steady rate with
    a deadline while the link is blackholed for a while, then healed. Nothing may hang: every
    call is answered or fails with DEADLINE_EXCEEDED/UNAVAILABLE, and calls succeed again soon
    after the heal."""
    import grpc

    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import Identity
    from testkit.faultproxy import FaultProxy
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    class Health(rpc.RelayServicer):
        async def Health(self, request, context):
            return pb.HealthReply(node_id="reliability", role="relay", serving=True)

    before, fault_len, after = ctx.seconds(2.0, 1.0), ctx.seconds(5.0, 2.0), ctx.seconds(4.0, 2.0)
    deadline, interval = 1.0, 0.05
    tls_id = tls.make_self_signed(Identity.generate())
    server, port = tls.new_server(tls_id, "127.0.0.1:0")
    rpc.add_RelayServicer_to_server(Health(), server)
    await server.start()
    proxy = await FaultProxy("127.0.0.1", port, seed=ctx.seed).start()
    channel = tls.pinned_channel(proxy.address, tls_id.cert_pem)
    stub = rpc.RelayStub(channel)
    counts = {"sent": 0, "answered": 0, "clear": 0, "lost": 0}
    healed_at: list[float] = []
    first_ok_after_heal: list[float] = []

    async def one_call() -> None:
        counts["sent"] += 1
        try:
            await asyncio.wait_for(stub.Health(pb.Empty(), timeout=deadline), 10 * deadline)
            counts["answered"] += 1
            if healed_at and not first_ok_after_heal:
                first_ok_after_heal.append(time.monotonic())
        except grpc.aio.AioRpcError as exc:
            clear = exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
            counts["clear" if clear else "lost"] += 1
        except asyncio.TimeoutError:  # the deadline did not fire: a hang
            counts["lost"] += 1

    async def load(seconds: float) -> None:
        calls = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            calls.append(asyncio.ensure_future(one_call()))
            await asyncio.sleep(interval)
        await asyncio.gather(*calls)

    try:
        await load(before)
        proxy.blackhole()
        await load(fault_len)
        proxy.pass_through()
        healed_at.append(time.monotonic())
        await load(after)
    finally:
        await channel.close()
        await proxy.stop()
        await server.stop(None)
    recover = first_ok_after_heal[0] - healed_at[0] if first_ok_after_heal else None
    return Outcome(requests_sent=counts["sent"], answered=counts["answered"], lost=counts["lost"],
                   failed_clearly=counts["clear"], recover_s=recover,
                   note=f"{fault_len:.0f} s blackhole, RPC deadline {deadline:.0f} s",
                   extra={"blackholed_bytes": sum(proxy.stats.blackholed.values())})


def shared(name: str, **kwargs) -> Callable[[Context], Awaitable[Outcome]]:
    """A scenario of testkit.scenarios (the same code the tests/test_faults_*.py
    assert on), run in a fresh temporary directory; its dict becomes the Outcome."""
    async def run(ctx: Context) -> Outcome:
        import tempfile

        from testkit import scenarios

        with tempfile.TemporaryDirectory(prefix=f"gt-rel-{name}-") as tmp:
            out = await getattr(scenarios, name)(Path(tmp), seed=ctx.seed, quick=ctx.quick, **kwargs)
        return Outcome(**out)
    return run


def _relay(mode: str, what: str) -> Scenario:
    return Scenario(f"relay-{mode}", f"{what}; that relay is on 2 of 4 paths (k = 2), real overlay",
                    shared("relay_faults", mode=mode))


def _model(mode: str, what: str) -> Scenario:
    return Scenario(f"model-{mode}", f"{what}; 1 of 2 echo-model processes, listed first (real processes)",
                    shared("model_faults", mode=mode))


def _adversary(name: str, what: str) -> Scenario:
    """An attack on the anonymous path (testkit.scenarios.adversary_path): "lost" counts the
    attacker's successes too; the note gives its success rate and cost."""
    return Scenario(f"adversary-{name[4:].replace('_', '-')}", what, shared(name))


def _epoch(mode: str, what: str) -> Scenario:
    return Scenario(f"epoch-{mode}", f"{what}; 4 verifier nodes, scripted model replies and reference scores",
                    shared("epoch_faults", mode=mode))


def _group_attack(mode: str, what: str) -> Scenario:
    return Scenario(f"adversary-group-{mode}", f"{what}; a trusted insider among 3 members (real gossip servers)",
                    shared("group_adversary", mode=mode))


#: THE registry: every scenario the table reports, in this order (see the module docstring).
SCENARIOS: list[Scenario] = [
    Scenario("link-blackhole", "gRPC/TLS link blackholed, then healed (fault proxy)", link_blackhole),
    Scenario("verifier-kill9-pause", "4 gt-verifier processes: seeded kill -9 + restart, SIGSTOP/SIGCONT",
             shared("verifier_kills")),
    Scenario("verifier-partition", "fault proxies: 2-2 partition, then 3-1, then heal",
             shared("verifier_partitions")),
    Scenario("verifier-gossip", "validator 2 down, link 3->1 cut: 1 hears 3 only through relayed votes, "
             "then heal", shared("verifier_gossip")),
    Scenario("verifier-byzantine", "validator 3 equivocates; forged-signature votes for 0..2",
             shared("verifier_byzantine")),
    Scenario("verifier-crash-points", "failpoints: kill -9 between FinalizeBlock and Commit, after Commit, "
             "after signing a vote / a proposal (+ after block save, before signing in full runs), restart",
             shared("verifier_crash_points")),
    Scenario("verifier-clock-skew", "libfaketime: one validator's clock +1 h, another's -1 h",
             shared("verifier_clock_skew")),
    _relay("kill", "relay killed"),
    _relay("hang", "relay holds cloves past every deadline (paused)"),
    _relay("drop", "relay silently drops the cloves it forwards"),
    _relay("corrupt", "relay flips a bit in every clove it forwards"),
    _relay("replay", "relay sends every clove twice"),
    Scenario("relay-proc-kill9", "8 gt-user relay processes: kill -9 of relays on 2 of 4 paths (k = 2)",
             shared("relay_process_faults", mode="kill9")),
    Scenario("relay-proc-pause", "relay processes on 2 of 4 paths SIGSTOPped, then SIGCONTed and probed",
             shared("relay_process_faults", mode="pause")),
    Scenario("relay-proc-link", "fault proxy into relay processes on 2 of 4 paths: drop, delay, blackhole, heal",
             shared("relay_process_faults", mode="link")),
    _model("kill-mid-stream", "model node SIGKILLed while streaming a reply"),
    _model("hang", "model node SIGSTOPped while streaming, SIGCONT at the end"),
    _model("garbage", "model node replies with undecodable messages in valid cloves"),
    _model("bad-signature", "model node replies right, receipt signature broken"),
    _model("refuse", "model node refuses every query as busy"),
    _epoch("leader-drop", "every leader reports the honest node's reply missing"),
    _epoch("leader-alter", "every leader changes a token of the honest node's reply"),
    _epoch("leader-forge", "every leader posts a reply of its own under the honest node's name"),
    _epoch("node-down", "a model node stops answering challenges"),
    _epoch("node-cheat", "a model node answers with implausible tokens"),
    # adversary: a group member attacks its model group (figures: attacker's success, cache affinity kept)
    _group_attack("subtree-forge", "gossip rewrites other members' subtrees at version 2^64-1"),
    _group_attack("stats-forge", "Sentry statistics in other members' names, and its own, naming a fake prefix"),
    _group_attack("layout-pin", "advertises a layout of the last epoch that no prompt fills"),
    _group_attack("origin-flood", "fills the group's 50 origin slots with made-up origins as a member joins"),
    _group_attack("capacity-lie", "claims capacity 10 (registered: 1)"),
    _group_attack("claim-and-lie", "NOT DEFENDED: claims every subtree it hears and an idle engine"),
    # adversary: attacks on the anonymous path (THREAT_MODEL.md, "The anonymous path")
    _adversary("adv_tagging", "hop 1 XORs a pattern into cloves, a colluding proxy looks for it"),
    _adversary("adv_replay_flush", "hop 1 floods its successor with 65,536 junk cloves, then replays"),
    _adversary("adv_onion_replay", "an establishment onion replayed: path up, expired, an hour later"),
    _adversary("adv_link_theft", "a registered non-neighbour sends on a known link ID"),
    _adversary("adv_peer_quota", "an attacker fills a relay's per-peer quota, then the victim builds"),
    _adversary("adv_model_amplify", "a stranger, then a proxy naming 16 routes, submit to a model node"),
    _adversary("adv_position_timing", "every relay times hop-local acks (and reply delays) to guess its position"),
    _adversary("adv_position_alone", "each relay alone, with the model node, guesses hop 1 from frames, reply delay, establishment"),
    _adversary("adv_reply_linking", "the model node links asks by their reply routes"),
    _adversary("adv_sizes_tokens", "relays read prompt length from sizes, token counts from reply cloves"),
    _adversary("adv_address_hijack", "the model node's and a relay's addresses registered by an attacker"),
    _adversary("adv_nonce_reuse", "3 proxies replay a query's cloves, before and after the node forgets it"),
    # adversaries (THREAT_MODEL.md): "lost" counts what the attacker achieved
    Scenario("adversary-address-hijack", "registrations of a model node's address (as model and user) with the "
             "attacker's certificate, and a tx for another chain, while a user asks",
             shared("registry_hijack")),
    Scenario("adversary-directory-replay", "a Byzantine verifier (1 of 4) replays an old signed directory to "
             "clients refreshing again and again", shared("directory_replay")),
]


# --------------------------------------------------------------------------- runner


async def run_one(scenario: Scenario, ctx: Context) -> tuple[Outcome, float, str | None]:
    start = time.monotonic()
    try:
        outcome = await scenario.run(ctx)
        error = None
    except Exception as exc:  # noqa: BLE001 - one failed scenario must not hide the others
        traceback.print_exc(file=sys.stderr)
        outcome = Outcome(note=f"scenario raised {type(exc).__name__}: {exc}")
        error = f"{type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - start, error


def _cell(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def markdown(rows: list[dict]) -> str:
    head = ("| scenario | fault injected | sent | answered | lost | clear errors | committed txs lost "
            "| forks | time to recover (s) | survived | note |")
    lines = ["# Reliability results", "",
             "Written by `bench/reliability.py` (scenario registry: `SCENARIOS` there).", "",
             head, "|" + "---|" * 11]
    for r in rows:
        o = r["outcome"]
        lines.append("| " + " | ".join([
            r["name"], r["fault"], _cell(o["requests_sent"]), _cell(o["answered"]), _cell(o["lost"]),
            _cell(o["failed_clearly"]), _cell(o["committed_txs_lost"]), _cell(o["forks"]),
            _cell(o["recover_s"]), "yes" if r["survived"] else "**NO**", o["note"].replace("|", "/"),
        ]) + " |")
    failed = [r["name"] for r in rows if not r["survived"]]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} scenarios survived"
              + (f"; not survived: {', '.join(failed)}." if failed else ".")]
    return "\n".join(lines) + "\n"


async def run_all(scenarios: list[Scenario], ctx: Context) -> list[dict]:
    rows = []
    for scenario in scenarios:
        print(f"[reliability] {scenario.name} ...", file=sys.stderr, flush=True)
        outcome, took, error = await run_one(scenario, ctx)
        survived = error is None and outcome.survived()
        print(f"[reliability] {scenario.name}: {'survived' if survived else 'NOT survived'} "
              f"in {took:.1f} s", file=sys.stderr, flush=True)
        rows.append({"name": scenario.name, "fault": scenario.fault, "outcome": asdict(outcome),
                     "survived": survived, "seconds": round(took, 2), "error": error})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the registered scenarios and exit")
    parser.add_argument("--quick", action="store_true", help="short runs (CI-sized)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown table to write")
    parser.add_argument("--tiny", action="store_true",
                        help=f"seconds, what make test runs: {TINY_SCENARIO} --quick, the table in a temporary file")
    args = parser.parse_args(argv)
    if args.tiny:
        args.only, args.quick = [TINY_SCENARIO], True
        if args.out == DEFAULT_OUT:
            args.out = Path(tempfile.mkdtemp(prefix="gt-reliability-")) / "reliability.md"
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name}: {s.fault}")
        return 0
    chosen = SCENARIOS
    if args.only:
        unknown = set(args.only) - {s.name for s in SCENARIOS}
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        chosen = [s for s in SCENARIOS if s.name in args.only]
    rows = asyncio.run(run_all(chosen, Context(quick=args.quick, seed=args.seed)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(rows))
    print(json.dumps({"bench": "reliability", "quick": args.quick, "cpus": os.cpu_count(),
                      "scenarios": len(rows), "survived": sum(r["survived"] for r in rows),
                      "table": str(args.out), "rows": rows}))
    return 0 if all(r["survived"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
