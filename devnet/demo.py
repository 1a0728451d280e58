"""`make demo`: the whole system in one run, on this machine.

1. bring a devnet up (devnet.network: 4 verifiers, 2 honest + 1 dishonest model node,
   12 user nodes, TLS everywhere; every model and user node registers itself with the
   committee and shares nothing but its genesis file) and wait until it is healthy;
2. ask questions anonymously through the overlay; print each answer, the model node that
   registered itself and served it, the route of each clove (user -> relays -> proxy -> model
   node) and the per-stage timings; then one request the model group forwarded: its prompt
   shares a long prefix with one an honest node served, it is sent to the other honest node,
   whose Hash-Radix tree matches the prefix and forwards it (received by, served by, matched
   depth);
3. verification: watch the verifiers' epochs (VRF leader, challenges through the overlay,
   scoring with the reference engine) until the dishonest node is untrusted, reading the
   reputations from the committee's certified directory (the same light-client check every
   node does); ask once more, once the asking user node's own directory has the verdict, to
   show the untrusted node has left the users' routing; print the reputation table;
4. bring the devnet down, and check that nothing it started is left running.

Step 3 never pretends: if this build's verifiers do not run epochs yet, it says so and
prints the reputations as the committee holds them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import json
import time
from dataclasses import replace
from pathlib import Path

from devnet import network as devnet
from gentorrent.config import DEVNET, MODEL_NODE, REPUTATION

QUESTIONS = ("In one sentence: why is the sky blue?", "Name three primary colours.")
#: a shared prefix long enough for the group's tree to match it (> 2 chunks of 32 tokens)
#: a system prompt long enough for the group's tree to follow: match_depth_threshold chunks of
#: default_chunk_length tokens (2 x 128) and more, as an operator's real system prompts are
SHARED_PREFIX = ("You are the assistant of a small public library. The library opens at nine in the morning and "
                 "closes at six in the evening from Monday to Friday, and at noon on Saturdays. Members may borrow "
                 "up to eight books for three weeks and renew them twice online. Printing costs ten cents a page. "
                 "The reading room is quiet; group study rooms on the second floor can be booked for two hours. "
                 "Children under twelve need a parent's signature to join, and their cards let them borrow from "
                 "the children's section and the young adult shelves only. Adults may join with any document that "
                 "shows their name and an address in the county; visitors from elsewhere pay five dollars a year. "
                 "Lost cards are replaced for one dollar at the front desk, which also takes payment for late "
                 "returns: ten cents a day for books, one dollar a day for films and games, and never more than the "
                 "price of the item. Books may be returned to the drop box by the car park at any hour; the box is "
                 "emptied every morning at half past eight, and items found there count as returned the day "
                 "before. The library lends laptops for use inside the building for up to three hours, against a "
                 "member's card, and the wireless network needs no password. Three computers on the ground floor "
                 "are kept for job searches and forms from the county office; a librarian can help with them on "
                 "Tuesday and Thursday afternoons. The café in the lobby is run by volunteers and closes an hour "
                 "before the library does. Dogs are welcome in the garden but not inside, except assistance dogs. "
                 "The local history room on the third floor holds maps, newspapers since 1870 and parish records; "
                 "its items never leave the room, and photographs of them are free for private use. Story time for "
                 "toddlers is on Wednesday at ten, the chess club meets on Friday at five, and the book club on the "
                 "first Monday of each month at seven, in the large meeting room, which groups can also book for "
                 "free when it is not in use. Answer the visitor's question in one short sentence.\n\nQuestion: ")
FORWARD_QUESTIONS = ("When does the library open?", "How many books may I borrow?", "How long is a loan?")
FORWARD_BRANCHES = 16  # prefixes tried for one whose rendezvous home is one of the chosen pair
#: gossip rounds (ROUTING.gossip_interval_s each) to wait before the second ask of the prefix
FORWARD_GOSSIP_ROUNDS = 2
#: how long the demo watches the epochs (the paper: a cheater is untrusted within 5 epochs). On
#: 2 shared cores an epoch takes about 2 minutes: the four members score every challenge reply
#: (forwarded ones too, for the node that served them) on one shared reference engine, and the
#: cheater is sampled only in the epochs a challenge is routed to it (THREAT_MODEL.md)
VERIFY_TIMEOUT_S = 900.0


def say(text: str = "") -> None:
    print(text, flush=True)


def step(n: int | str, title: str) -> None:
    say()
    say(f"=== {n}. {title}")


# --------------------------------------------------------------------------- verification


def reputation_table(state: devnet.DevnetState) -> list[dict]:
    """One row per model node, as the committee's certified directory has it."""
    directory = asyncio.run(devnet.committee_directory(Path(state.genesis), devnet.node_ids(state)))
    certified = {m.node_id.hex(): m for m in directory.models}
    rows = []
    for m in state.of_role("model"):
        record = certified.get(m.node_id)
        rows.append({"name": m.name, "node_id": m.node_id, "dishonest": bool(m.extra.get("dishonest")),
                     "cheat": m.extra.get("cheat", ""),
                     "reputation": record.reputation if record else None,
                     "trusted": record.trusted if record else None, "height": directory.height,
                     "registered_height": record.registered_height if record else None})
    return rows


def _table_at(state: devnet.DevnetState, height: int, wait_s: float = 15.0) -> list[dict]:
    """The reputation table once the certified directory has reached `height` (a light client
    checks a height against the next block's app hash, so the directory trails the chain by a
    block or two), or as it stands after `wait_s`."""
    deadline = time.monotonic() + wait_s
    rows = reputation_table(state)
    while rows and rows[0]["height"] < height and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = reputation_table(state)
    return rows


def print_table(rows: list[dict]) -> None:
    say(f"  {'model node':12s} {'node id':18s} {'serves':40s} {'reputation':>10s}  trusted")
    for r in rows:
        serves = f"{r['cheat']} cheater claiming {MODEL_NODE.default_model}" if r["dishonest"] else \
            f"{MODEL_NODE.default_model} (honest)"
        rep = "–" if r["reputation"] is None else f"{r['reputation']:.3f}"
        trusted = "–" if r["trusted"] is None else ("yes" if r["trusted"] else "NO (untrusted)")
        say(f"  {r['name']:12s} {r['node_id'][:16]}… {serves:40s} {rep:>10s}  {trusted}")


def epochs_section(state: devnet.DevnetState):
    """The committee's committed epochs section (query /epochs), or None if it has none."""
    from gentorrent.crypto.tls import connect
    from gentorrent.wire import gentorrent_pb2 as pb
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from gentorrent.ledger.genesis import Genesis

    async def query() -> pb.QueryReply:
        v = Genesis.load(Path(state.genesis)).validators[0]
        channel = await connect(v.address, v.tls_cert_pem, timeout=10)
        try:
            return await rpc.VerifierStub(channel).Query(pb.QueryRequest(path="/epochs"), timeout=10)
        finally:
            await channel.close()

    reply = asyncio.run(query())
    if reply.code != 0:
        return None
    section = pb.EpochsSection()
    section.ParseFromString(reply.value)
    return section


def epochs_running(state: devnet.DevnetState) -> bool:
    """Whether the devnet's verifiers were started with verification epochs (and a reference)."""
    return state.epochs


def run_verification(state: devnet.DevnetState, timeout_s: float = VERIFY_TIMEOUT_S) -> dict[str, int] | None:
    """Watch the verifiers' epochs until every dishonest node is untrusted; then, per cheater, how
    many epochs that opened after it registered had closed when it was first seen untrusted
    (name -> count; the paper's goal: REPUTATION.goal_epochs), else None.

    The verifiers run epochs by themselves (gt-verifier start --epochs: VRF leader, challenges
    through the overlay, scoring with the reference engine, reputation update in FinalizeBlock);
    the demo only reads the committed epochs section and the certified directory.
    """
    if not epochs_running(state):
        say("  NOT AVAILABLE YET: this build's `gt-verifier start` has no --epochs, so the committee runs")
        say("  no verification epochs. The table below is the committee's registry as it stands, not a")
        say("  verification result.")
        return None
    names = {m.node_id: m.name for m in state.of_role("model")}
    cheaters = {m.node_id for m in state.of_role("model") if m.extra.get("dishonest")}
    t0, closed, phase = time.monotonic(), 0, ""
    untrusted_at: dict[str, int] = {}  # name -> the last closed epoch when first seen untrusted
    closed_at: dict[int, int] = {}  # epoch -> the height it closed at (the next one opened there)
    while True:
        rows = reputation_table(state)  # before the section: an epoch closing in between counts late, never early
        section = epochs_section(state)
        if section is not None:
            now_phase = f"epoch {section.epoch}: {section.current.phase}" if section.epoch else "no epoch yet"
            if now_phase != phase:
                say(f"  [{time.monotonic() - t0:4.0f}s] {now_phase}")
                phase = now_phase
            for summary in section.history:
                closed_at[summary.epoch] = summary.closed_height
                if summary.epoch > closed:
                    closed = summary.epoch
                    _say_epoch(summary, names, _table_at(state, summary.closed_height))
        for r in rows:
            if r["node_id"] in cheaters and r["trusted"] is False:
                untrusted_at.setdefault(r["name"], closed)
        if cheaters and all(r["trusted"] is False for r in rows if r["node_id"] in cheaters):
            joined = {r["name"]: r["registered_height"] for r in rows}
            epochs = {name: sum(1 for e in range(1, epoch + 1) if closed_at.get(e - 1, 0) >= joined[name])
                      for name, epoch in untrusted_at.items()}
            goal = REPUTATION.goal_epochs
            say("  untrusted: " + ", ".join(
                f"{name} after epoch {untrusted_at[name]}, {n} epoch(s) after it registered"
                f"{'' if n <= goal else f' (goal: within {goal})'}" for name, n in sorted(epochs.items())))
            return epochs
        if time.monotonic() - t0 > timeout_s:
            say(f"  the dishonest node is still trusted after {timeout_s:.0f}s ({closed} epochs closed)")
            return None
        time.sleep(3)


def ask_after_verdict(state: devnet.DevnetState, root: Path, question: str) -> dict:
    """Once the asking user node's own (light-client-checked) directory holds the committee's
    verdict, ask: the untrusted node is no longer a candidate."""
    from devnet.supervisor import wait_until

    verdict_height = asyncio.run(devnet.committee_directory(Path(state.genesis), devnet.node_ids(state))).height
    user = 2 % len(state.of_role("user"))
    asker = state.of_role("user")[user]
    wait_until(lambda: devnet.user_status(asker)["directory_height"] >= verdict_height, 60,
               f"user node {asker.name} to refresh its directory past height {verdict_height}")
    return devnet.ask(question, root, user=user, max_tokens=24)


# --------------------------------------------------------------------------- forwarding


def _wait_for_subtree(receiver, holder) -> None:
    """Until the receiver's Hash-Radix tree holds the holder's subtree (both registered
    themselves moments ago: each must see the other in the committee's directory, then gossip),
    at most FORWARD_GOSSIP_ROUNDS gossip intervals after the first round that could carry it."""
    from gentorrent.config import ROUTING

    deadline = time.monotonic() + (FORWARD_GOSSIP_ROUNDS + 1) * ROUTING.gossip_interval_s \
        + ROUTING.directory_refresh_s
    while time.monotonic() < deadline:
        routing = devnet.model_status(receiver).get("routing", {})
        members = routing.get("members", [])
        if holder.node_id in members and routing.get("tree", {}).get("origins", 0) >= len(members):
            time.sleep(ROUTING.gossip_interval_s)  # and one round more for its newest delta
            return
        time.sleep(0.5)


def show_forwarding(state: devnet.DevnetState, root: Path, pair: tuple | None = None) -> dict | None:
    """One request the model group forwarded: the answer, who received it, who served it, and
    the matched depth the receiver's Hash-Radix tree found (from its own status). `pair`:
    (holder, receiver) model nodes; default the two first honest ones."""
    honest = [m for m in state.of_role("model") if not m.extra.get("dishonest")]
    if pair is None and len(honest) < 2:
        say("  (needs two honest model nodes: skipped)")
        return None
    pair = pair or (honest[0], honest[1])
    # a new prefix is served at its rendezvous home (policy.py), which may be any member of the
    # group: take a prefix (a branch name in front) whose home is one of the pair. With g
    # members of equal capacity a branch misses the pair with odds (g-2)/g, so 16 branches
    # miss it with odds 1.5e-5 in the devnet test's group of four
    for branch in range(1, FORWARD_BRANCHES + 1):
        prefix = f"[Branch {branch}] {SHARED_PREFIX}"
        first = devnet.ask_node(prefix + FORWARD_QUESTIONS[0], pair[0], root, max_tokens=12)
        if first["served_by"] in {n.node_id for n in pair}:
            break
    else:
        say(f"  no prefix of {FORWARD_BRANCHES} tried had its home on {pair[0].name} or {pair[1].name}: "
            "nothing to show")
        return None
    holder, receiver = pair if first["served_by"] == pair[0].node_id else (pair[1], pair[0])
    say(f"  asked {first['sent_to_name']} a question after a {len(prefix.split())}-word shared prefix: "
        f"served by {first['served_by_name']} (its engine now caches the prefix, its tree says so)")
    for question in FORWARD_QUESTIONS[1:]:
        _wait_for_subtree(receiver, holder)  # the holder's subtree travels by gossip
        before = len(devnet.model_status(receiver).get("routing", {}).get("recent_forwards", []))
        answer = devnet.ask_node(prefix + question, receiver, root, max_tokens=12)
        forwards = devnet.model_status(receiver).get("routing", {}).get("recent_forwards", [])
        if answer["served_by"] != answer["sent_to"] and len(forwards) > before:
            hop = forwards[-1]
            say(f"  asked {answer['sent_to_name']} the same prefix with another question: received by "
                f"{answer['sent_to_name']}, whose Hash-Radix tree matched {state.name_of(node_id=hop['to'])}'s "
                f"prefix at depth {hop['depth']} ({hop['reason']}, {hop['prompt_tokens']}-token prompt) and "
                f"forwarded it; served and signed by {answer['served_by_name']}")
            say(f"  A: {answer['text'].strip()}")
            return {**answer, "forward": hop}
        say(f"  {answer['sent_to_name']} served it itself this time (its view of the group's load said so); "
            f"trying once more")
    routing = devnet.model_status(receiver).get("routing", {})
    say("  no request was forwarded (the receiver kept every one); its routing: "
        + json.dumps({k: routing.get(k) for k in ("members", "tree", "decisions", "fallbacks", "recent_forwards", "gossip")}))
    return None


def _say_epoch(summary, names: dict, rows: list[dict]) -> None:
    scores = ", ".join(f"{names.get(s.node_id.hex(), s.node_id.hex()[:8])} {s.score_micros / 1e6:.3f}"
                       for s in summary.result)
    leader = "faulty leader" if summary.faulty_leader else "leader ok"
    say(f"  epoch {summary.epoch} closed: {summary.phase} ({leader}{'; ' + summary.reason if summary.reason else ''})"
        f"; credibility {scores or '–'}")
    say("    reputation now: " + ", ".join(f"{r['name']} {r['reputation']:.3f}{'' if r['trusted'] else ' UNTRUSTED'}"
                                          for r in rows if r["reputation"] is not None))


# --------------------------------------------------------------------------- the demo


def run(root: Path, users: int, questions: tuple[str, ...], parallel: int) -> int:
    t0 = time.monotonic()
    say("GenTorrent demo: a whole network on 127.0.0.1 (gRPC over pinned TLS everywhere)")
    step(1, "devnet up")
    shape = replace(DEVNET, users=users, parallel_model_starts=parallel)
    ok, caught, left, epochs, forwarded = False, False, [], False, False
    wronged: list[str] = []
    t_up = t_ask = t_verify = 0.0
    try:
        state = devnet.up(root, shape, progress=say)
        epochs = state.epochs
        for v in state.of_role("verifier"):
            if v.extra.get("dashboard"):
                say(f"  status page of {v.name}: {v.extra['dashboard']}")
        t_up = time.monotonic() - t0
        step(2, "anonymous questions through the overlay (the routing picks the model node)")
        t1 = time.monotonic()
        for i, question in enumerate(questions):
            say(f"  Q: {question}")
            answer = devnet.ask(question, root, user=i % users, max_tokens=48)
            say("  A: " + devnet.describe_answer(answer).replace("\n", "\n     "))
        step("2b", "forwarding in the model group (Hash-Radix tree + Algorithm 2)")
        forwarded = show_forwarding(state, root) is not None
        t_ask = time.monotonic() - t1
        step(3, "verification epochs until the cheater is untrusted")
        t2 = time.monotonic()
        caught = run_verification(state)
        if caught:
            answer = ask_after_verdict(state, root, questions[0])
            say(f"  asked again after the verdict: served by {answer['served_by_name']}, "
                f"the untrusted node has left the users' routing")
        say("  reputation table (from the committee's certified directory):")
        rows = reputation_table(state)
        print_table(rows)
        wronged = [r["name"] for r in rows if not r["dishonest"] and r["trusted"] is False]
        if wronged:  # must not happen: shown, not hidden, and the demo fails
            say(f"  HONEST NODE UNTRUSTED: {', '.join(wronged)} (see step 3's epoch notes)")
        t_verify = time.monotonic() - t2
        ok = True
    finally:
        step(4, "devnet down")
        t3 = time.monotonic()
        stopped = devnet.down(root)
        left = devnet.running(Path(root).resolve())
        say(f"  stopped {len(stopped)} processes in {time.monotonic() - t3:.0f}s; "
            + ("nothing left running" if not left else f"STILL RUNNING: {left}"))
    say()
    say(f"demo finished in {time.monotonic() - t0:.0f}s: devnet up {t_up:.0f}s, ask {t_ask:.1f}s, "
        f"verification {t_verify:.0f}s ({'cheater caught' if caught else 'cheater NOT caught: see step 3'}"
        f"{'; HONEST NODE UNTRUSTED' if wronged else ''}; "
        f"{'a request forwarded' if forwarded else 'NO request forwarded: see step 2b'})")
    return 0 if ok and not left and not wronged and forwarded and (caught or not epochs) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devnet.demo", description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=devnet.DEFAULT_ROOT)
    p.add_argument("--users", type=int, default=DEVNET.users)
    p.add_argument("--question", action="append", help="ask this (repeatable; default: two questions)")
    p.add_argument("--parallel-models", type=int, default=DEVNET.parallel_model_starts)
    args = p.parse_args(argv)
    try:
        return run(args.root, args.users, tuple(args.question or QUESTIONS), args.parallel_models)
    except (devnet.DevnetError, TimeoutError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
