"""Cheater detection: honest false-positive rate and epochs-to-untrusted per cheater kind over
35 epochs, from REAL credibilities of real nodes.

    flock /tmp/gt-heavy.lock nice .venv/bin/python bench/detection.py [--honest 200] [--per-cheater 30]
    .venv/bin/python bench/detection.py --no-record     # re-analyse the cache (seconds); without
                                                        # one, the committed per-reply credibilities
    .venv/bin/python bench/detection.py --quick         # smoke run
    .venv/bin/python bench/detection.py --tiny          # seconds, no figure: what make test runs

Two stages, said out loud:

1. Recording (real parts, slow, resumable): questions are user turns drawn as the committee
   draws challenges (the traffic model over real user conversations, gentorrent.traffic); they go out in
   several request shapes (single question, system prompt, multi-turn, pasted notes), at
   temperatures 0-1, top_p 1 or 0.9, 96 or 128 tokens, streamed or not. The honest node (the
   reference itself: independent samples of the honest model) answers --honest of them and each
   cheater (`python -m testkit.dishonest_model --dishonest KIND serve`) answers --per-cheater; the reference scores every reply in
   one teacher-forced pass. The raw token scores go to results/detection_cache/ (gitignored), so
   a change to the scoring is re-measured with --no-record in seconds.
2. Resampling (pure): --runs runs of 35 epochs per node, one challenge per epoch drawn from ITS
   recorded replies, through each member's repeated-output memory (verifier.epochs.repeats) and
   the reputation update exactly as FinalizeBlock applies it. Each epoch also audits the node's
   real replies: Binomial(--asks-per-epoch, rate) audited asks (at most the desk's per-node cap),
   each reply drawn from what the node does on REAL traffic (the selective cheater: the `random`
   kind's cheap reply, or the honest one on the share of user prompts its detector flags), folded
   by the committee's own functions (verifier.epochs.audits: audit_score, agree_audit_scores,
   fold_credibility), for every rate of --audit-rates (0: challenges only).
   The selective cheater (`selective_cheater`) is built as a real one would be: a text model and
   a lookup of near copies in the stored public corpus, thresholds set on held-out real prompts
   at FALSE_ALARMS; one more node, MODELLED rather than recorded, stands for it on challenges made
   of users' donated asks (`donated_challenge_rows`).

Prints ONE JSON line (honest false-positive rate with its 95 % Wilson interval, the
epochs-to-untrusted distribution per cheater kind without audits and, under "audits", with them
per rate, the selective cheater's own accuracy) and
writes results/detection.png and results/detection_scores.json (per-reply credibilities).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gentorrent.config import AUDITS, AuditParams  # noqa: E402

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCORES = ROOT / "results" / "detection_scores.json"
RESULT = ROOT / "results" / "detection.json"  # the JSON line of the run that recorded the cache
CACHE = ROOT / "results" / "detection_cache"  # raw token scores (gitignored; resumable)
FIGURE = ROOT / "results" / "detection.png"
CHEATERS = ("replay", "pruned", "noisy", "other-model", "random", "selective")  # selective last
EPOCHS_RUN = 35
MODEL = "smollm2-135m"
AUDIT_RATES = (0.0, 0.01, 0.02, 0.05)  # swept; AUDITS.rate (the committee's setting) is always added
# Real asks one model node answers per epoch. An epoch is EPOCH_RUN's deadlines (a few minutes);
# a small node serving a handful of users at a few asks a minute each answers ~200 in that time.
# It is a guess, not a measurement: the JSON line carries it, and audits scale with rate x asks.
ASKS_PER_EPOCH = 200
COMMITTEE = 4  # members reporting audit scores (the devnet's committee)


def _progress(msg: str) -> None:
    print(f"[bench/detection] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- recording (real)


class Served:
    """One `gt-model serve` process (optionally dishonest) on 127.0.0.1."""

    def __init__(self, kind: str | None, env: dict | None = None) -> None:
        self.kind = kind
        self.home = Path(tempfile.mkdtemp(prefix=f"gt-detect-{kind or 'honest'}-"))
        node = ["testkit.dishonest_model", "--dishonest", kind] if kind else ["model_node.cli"]
        self.log = open(self.home / "serve.out", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", *node, "serve", "--model", MODEL,
                                      "--home", str(self.home), "--listen", "127.0.0.1:0"],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                     env=env)

    def wait(self, timeout: float = 1200.0) -> dict:
        deadline = time.monotonic() + timeout
        while not (self.home / "node.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gt-model serve ({self.kind}) did not start; see {self.home / 'serve.out'}")
            time.sleep(1.0)
        return json.loads((self.home / "node.json").read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


SHAPES = ("single", "system", "multi-turn", "document")
SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a concise assistant. Answer in a few sentences.",
                  "You are a friendly tutor who explains things simply.")
TEMPERATURES = (0.0, 0.3, 0.5, 0.7, 1.0)


def request_specs(n_questions: int, count: int, seed: int) -> list[dict]:
    """`count` request shapes (message structure, sampling, max_tokens, streaming), seeded."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        q = i % n_questions
        others = rng.sample([j for j in range(n_questions) if j != q], 3)
        specs.append({"i": i, "question": q, "others": others, "shape": SHAPES[i % len(SHAPES)],
                      "system": rng.choice(SYSTEM_PROMPTS), "temperature": rng.choice(TEMPERATURES),
                      "top_p": rng.choice((1.0, 1.0, 0.9)), "max_tokens": rng.choice((96, 128, 128)),
                      "stream": rng.random() < 0.5})
    return specs


def build_request(spec: dict, questions: list[str]):
    """The GenerateRequest of one spec (the same bytes whichever node answers it)."""
    from gentorrent.generation import make_request

    q, others = questions[spec["question"]], [questions[j] for j in spec["others"]]
    if spec["shape"] == "single":
        messages = [{"role": "user", "content": q}]
    elif spec["shape"] == "system":
        messages = [{"role": "system", "content": spec["system"]}, {"role": "user", "content": q}]
    elif spec["shape"] == "multi-turn":
        messages = [{"role": "user", "content": others[0]},
                    {"role": "assistant", "content": "Good question. In short: it depends on the details."},
                    {"role": "user", "content": q}]
    else:
        doc = " ".join(others)
        messages = [{"role": "user", "content": f"Here are some notes:\n{doc}\n\nWith them in mind: {q}"}]
    return make_request(messages=messages, model=MODEL, max_tokens=spec["max_tokens"],
                        temperature=spec["temperature"], top_p=spec["top_p"], stream=spec["stream"])


def _compact(scores) -> list:
    """Token scores as [logprob, rank, sorted top values] (the scorer never reads the top ids)."""
    return [[round(lp, 5), r, [round(v, 5) for v in sorted(top.values(), reverse=True)]]
            for lp, r, top in zip(scores.logprob, scores.rank, scores.top_logprobs)]


def token_scores(compact: list):
    from verifier.epochs.scoring import TokenScores

    return TokenScores([t[0] for t in compact], [t[1] for t in compact],
                       [dict(enumerate(t[2])) for t in compact])


async def _record_node(reference, info: dict, questions: list[str], specs: list[dict], label: str,
                       concurrency: int) -> None:
    from gentorrent import receipts
    from gentorrent.crypto import tls
    from gentorrent.wire import gentorrent_pb2_grpc as rpc

    path = CACHE / f"{label}.jsonl"
    done = {json.loads(line)["i"] for line in path.read_text().splitlines()} if path.exists() else set()
    todo = [s for s in specs if s["i"] not in done]
    if not todo:
        return
    channel = await tls.connect(info["address"], Path(info["cert_file"]).read_bytes(), timeout=60)
    gate = asyncio.Semaphore(concurrency)
    out = path.open("a")

    async def one(spec: dict) -> None:
        async with gate:
            request = build_request(spec, questions)
            chunks = [c async for c in rpc.ModelNodeStub(channel).Generate(request, timeout=1800)]
            tokens = [t for c in chunks for t in c.token_ids]
            compact = _compact(await reference.score(request, tokens)) if tokens else []
            out.write(json.dumps({"i": spec["i"], "prompt_hash": receipts.request_prompt_hash(request).hex()[:16],
                                  "output_hash": receipts.output_hash(tokens).hex()[:16], "scores": compact}) + "\n")
            out.flush()
            _progress(f"{label} #{spec['i']}: {len(tokens)} tokens ({spec['shape']}, T={spec['temperature']})")

    try:
        await asyncio.gather(*(one(s) for s in todo))
    finally:
        out.close()
        await channel.close()


async def record(n_honest: int, per_cheater: int, kinds: list[str], concurrency: int) -> dict:
    """Record every reply not yet in the cache (resumable: rerun after a stop)."""
    from testkit.cheater_training import challenge_questions
    from verifier.epochs.reference import RemoteReference

    CACHE.mkdir(parents=True, exist_ok=True)
    qfile = CACHE / "questions.json"
    n_questions = max(8, n_honest // 3)
    questions = json.loads(qfile.read_text()) if qfile.exists() else []
    specs = request_specs(max(n_questions, len(questions)) if questions else n_questions, max(n_honest, per_cheater), 18)
    ref_proc = Served(None)
    try:
        ref_info = await asyncio.to_thread(ref_proc.wait)
        reference = RemoteReference(ref_info["address"], Path(ref_info["cert_file"]).read_bytes())
        if len(questions) < n_questions:
            questions = challenge_questions(n_questions, os.urandom(32))
            qfile.write_text(json.dumps(questions, indent=1))
            _progress(f"{len(questions)} questions drawn from the traffic model")
        specs = request_specs(len(questions), max(n_honest, per_cheater), 18)
        await _record_node(reference, ref_info, questions, specs[:n_honest], "honest", concurrency)
        for label in kinds:
            proc = Served(label, await _selective_env(reference) if label == "selective" else None)
            try:
                info = await asyncio.to_thread(proc.wait)
                await _record_node(reference, info, questions, specs[:per_cheater], label, max(1, concurrency // 2))
            finally:
                proc.stop()
        await reference.close()
    finally:
        ref_proc.stop()
    return {"questions": questions, "specs": specs}


async def _selective_env(reference) -> dict:
    """The selective cheater as a real one would be built (`selective_cheater`), as its node's
    environment. The bench's challenges come in user-ask shapes (as they must once drawn from a
    traffic model), so the cheater's shape signal is off."""
    setup = await asyncio.to_thread(selective_cheater)
    _progress(f"selective cheater: {json.dumps(setup)}")
    return {**os.environ, "GT_SELECTIVE_TEXT_MODEL": str(CACHE / "selective_text_model.json"),
            "GT_SELECTIVE_SHAPE": "none", "GT_SELECTIVE_LOOKUP_THRESHOLD": repr(setup["lookup_threshold"]),
            "GT_SELECTIVE_THRESHOLD": repr(setup["threshold"])}


SELECTIVE = CACHE / "selective.json"  # the selective cheater's settings and its own measures
SERVED = 900  # user prompts the cheater has served: a third to train, to calibrate, to measure on
FALSE_ALARMS = 0.02  # the share of its users' asks the cheater accepts to answer honestly


def selective_cheater() -> dict:
    """Train and calibrate the selective cheater from what a real cheater has: challenges it drew
    itself from the public traffic model (an independent draw from the bench's own), the prompts
    its users sent it (`served_prompts`, held-out conversations), and the public corpus, stored.
    Its text model learns challenges from the first third of those prompts; the lookup's and the
    detector's thresholds are set on the second third so that at most FALSE_ALARMS of them are
    taken for challenges (each half of that to the lookup); the last third measures it."""
    from testkit.cheaters import corpus_lookup
    from testkit.selective import ChallengeDetector
    from testkit.cheater_training import (challenge_questions, cross_validate, operating_threshold, served_prompts,
                                          train_text_model)

    qfile, model_file = CACHE / "cheater_questions.json", CACHE / "selective_text_model.json"
    if not qfile.exists():
        qfile.write_text(json.dumps(challenge_questions(100, os.urandom(32), "cheater"), indent=1))
    questions = json.loads(qfile.read_text())
    served = served_prompts(SERVED, seed=11)
    train, calibrate, measure = served[0::3], served[1::3], served[2::3]
    text = train_text_model(questions, train)
    text.save(model_file)
    lookup = corpus_lookup(float("inf"))
    near = [s if s < 1.0 else 0.0 for s in map(lookup.similarity, calibrate)]  # verbatim copies never count
    lookup.threshold = operating_threshold(near, FALSE_ALARMS / 2)
    detector = ChallengeDetector(text=text, lookup=lookup)
    detector.threshold = operating_threshold([detector.content_log_odds(t) for t in calibrate], FALSE_ALARMS)
    bench_questions = json.loads((CACHE / "questions.json").read_text())

    def flags(text: str) -> bool:
        return detector.content_log_odds(text) > detector.threshold

    def found(text: str) -> bool:
        return lookup.log_odds(text) > 0

    setup = {"lookup_threshold": round(lookup.threshold, 4), "threshold": round(detector.threshold, 4),
             "text_model_cross_validated": cross_validate(questions, train),
             "on_bench_challenges": _share(flags, bench_questions),
             "lookup_alone_on_bench_challenges": _share(found, bench_questions),
             "flags_user_asks": _share(flags, measure), "lookup_alone_flags_user_asks": _share(found, measure),
             "served_prompts": {"train": len(train), "calibrate": len(calibrate), "measure": len(measure)},
             "false_alarms_accepted": FALSE_ALARMS}
    SELECTIVE.write_text(json.dumps(setup, indent=1))
    return setup


def _share(taken: Callable[[str], bool], texts: list[str]) -> float:
    """The share of `texts` taken for challenges."""
    return round(sum(1 for t in texts if taken(t)) / max(1, len(texts)), 3)


def load_replies(label: str, specs: list[dict]) -> list[dict]:
    """The cached replies of one node, each with its spec."""
    path = CACHE / f"{label}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    by_i = {s["i"]: s for s in specs}
    return [{**r, "spec": by_i[r["i"]]} for r in sorted(rows, key=lambda r: r["i"]) if r["i"] in by_i]


# --------------------------------------------------------------------------- replay (pure)


def score_rows(rows: list[dict]) -> list[dict]:
    """The committee's credibility of every cached reply, with the statistics behind it."""
    from verifier.epochs.scoring import SamplingSpec, score_reply

    out = []
    for r in rows:
        spec = r["spec"]
        report = score_reply(token_scores(r["scores"]), SamplingSpec(spec["temperature"], spec["top_p"])) \
            if r["scores"] else None
        out.append({"i": r["i"], "shape": spec["shape"], "temperature": spec["temperature"], "top_p": spec["top_p"],
                    "stream": spec["stream"], "tokens": len(r["scores"]),
                    "credibility": report.credibility if report else 0.0,
                    "log_prob_bound": round(report.log_prob_bound, 2) if report else 0.0,
                    "inv_ppl": round(report.inv_ppl, 4) if report else 0.0,
                    "z": {k: round(v, 2) for k, v in report.z.items()} if report else {},
                    "prompt_hash": r["prompt_hash"], "output_hash": r["output_hash"]})
    return out


@dataclass(frozen=True)
class RealTraffic:
    """What a node answers on REAL asks, the pool its audited replies are drawn from: `cheap`
    on the asks it does not take for challenges, `honest` on the share `flagged` it does (a
    selective cheater's false alarms on user prompts). Every other node answers real asks as it
    answers challenges, so its pool is its own recorded replies."""

    cheap: tuple[float, ...]
    honest: tuple[float, ...] = ()
    flagged: float = 0.0

    def draw(self, rng: random.Random) -> float:
        pool = self.honest if self.honest and rng.random() < self.flagged else self.cheap
        return rng.choice(pool)


@dataclass(frozen=True)
class AuditSim:
    """Audits of one node's real replies per simulated epoch: Binomial(asks_per_epoch, rate)
    audited asks, of which the desk scores at most `params.max_per_node_epoch`; every member
    receives every audit (users hand each one to all members), so each reports the same score."""

    rate: float
    asks_per_epoch: int
    traffic: RealTraffic
    params: AuditParams = AUDITS
    committee: int = COMMITTEE

    def credibility(self, challenge: float, rng: random.Random, draws: "np.random.Generator") -> float:
        """The epoch credibility the committee folds from the challenge and this epoch's audits,
        through its own functions (audit_score per member, agree_audit_scores, fold_credibility)."""
        from verifier.epochs.audits import agree_audit_scores, audit_score, fold_credibility

        audited = min(int(draws.binomial(self.asks_per_epoch, self.rate)), self.params.max_per_node_epoch)
        scores = [self.traffic.draw(rng) for _ in range(audited)]
        if not scores:
            return challenge
        report = {b"node": audit_score(scores, self.params)}
        agreed = agree_audit_scores({f"member-{m}": report for m in range(self.committee)}, self.committee)
        return fold_credibility(challenge, [agreed[b"node"]])


@dataclass(frozen=True)
class _Scored:
    """A scored row as the committee's memory of outputs reads it (repeats.Scored)."""

    n_tokens: int
    credibility: float
    log_prob_bound: float


def run_epochs(rows: list[dict], epochs: int, rng: random.Random, memory_on: bool = True,
               audits: AuditSim | None = None, audit_rng: random.Random | None = None,
               per_epoch: int = 1, params=None) -> list[float]:
    """One node's reputation over `epochs`: one challenge per epoch drawn from its replies, through
    the committee's repeated-output memory, folded with that epoch's audits of its real replies
    (`audits`, None: challenges only), and the reputation update (FinalizeBlock's pure code).
    `memory_on=False`: a replayer that never repeats an output (the relevance test alone).
    Audits draw from their own `audit_rng`, so every audit rate sees the same challenges."""
    import numpy as np

    from gentorrent.config import REPUTATION
    from verifier.epochs import reputation as rep
    from verifier.epochs.repeats import CommitteeMemory

    if audits is not None and audit_rng is None:
        raise ValueError("audits need their own random source (audit_rng)")
    draws = np.random.default_rng(audit_rng.getrandbits(64)) if audit_rng is not None else None
    params = params or REPUTATION
    state, memory, curve = rep.initial_state(params), CommitteeMemory(), [params.initial_reputation]
    wanted = epochs * per_epoch
    order = rng.sample(rows, len(rows)) if len(rows) >= wanted else [rng.choice(rows) for _ in range(wanted)]
    for t in range(epochs):
        creds = []
        for row in order[t * per_epoch:(t + 1) * per_epoch]:
            prompt, output = bytes.fromhex(row["prompt_hash"]), bytes.fromhex(row["output_hash"])
            creds.append(memory.judge("node", prompt, output, row["temperature"],
                                      _Scored(row["tokens"], row["credibility"], row["log_prob_bound"]))
                         if memory_on else row["credibility"])
        cred = rep.robust_credibility(creds, params)  # one challenge: that challenge's score
        if audits is not None and audit_rng is not None and draws is not None:
            cred = audits.credibility(cred, audit_rng, draws)
        state = rep.update(state, cred, params)
        curve.append(state.reputation)
    return curve


REPLAY_UNIQUE = "replay (no output repeated)"
SELECTIVE_DONATED = "selective (donated challenges, modelled)"


def donated_challenge_rows(scored: dict[str, list[dict]], flagged: float) -> list[dict]:
    """The selective cheater's replies to challenges made of users' donated asks, MODELLED (not
    recorded): such a challenge is a real user's prompt, so the cheater takes it for a challenge
    as often as it does a user's ask (`flagged`, measured) and answers the rest as cheaply as
    everything else: its `random` replies, with honest ones in the share `flagged`."""
    cheap, honest = scored.get("random", []), scored.get("honest", [])
    if not cheap or not honest:
        return []
    n_honest = round(flagged / max(1e-9, 1.0 - flagged) * len(cheap))
    return cheap + honest[:n_honest]


def real_traffic(scored: dict[str, list[dict]], flagged: float) -> dict[str, RealTraffic]:
    """Each simulated node's replies to real asks. The selective cheater answers a real ask
    cheaply (the `random` kind's recorded replies: the cheapest answer it has) unless its
    detector flags the ask, which it does on a share `flagged` of user prompts (its measured
    false-alarm rate), and then answers as the honest node does."""
    creds = {label: tuple(r["credibility"] for r in rows) for label, rows in scored.items()}
    out = {label: RealTraffic(pool) for label, pool in creds.items()}
    if "replay" in creds:
        out[REPLAY_UNIQUE] = RealTraffic(creds["replay"])
    if "selective" in creds and "random" in creds:  # the same node, whichever its challenges are
        out["selective"] = out[SELECTIVE_DONATED] = RealTraffic(creds["random"], creds.get("honest", ()), flagged)
    return out


def resample(scored: dict[str, list[dict]], epochs: int, runs: int, seed: int, rates: tuple[float, ...],
             asks_per_epoch: int, flagged: float, params: AuditParams = AUDITS) -> dict[float, dict]:
    """Epochs-to-untrusted of every run, per audit rate and node (rate 0: challenges only). Each
    node's challenges come from one seeded stream and its audits from another, so every rate
    sees the same challenges and the rates differ by their audits alone."""
    below = _untrusted_below()
    traffic = real_traffic(scored, flagged)
    nodes = {label: (rows, True) for label, rows in scored.items()}
    if "replay" in scored:  # a replayer with a pool of other prompts' replies never repeats one
        nodes[REPLAY_UNIQUE] = (scored["replay"], False)
    donated = donated_challenge_rows(scored, flagged) if "selective" in scored else []
    if donated:
        nodes[SELECTIVE_DONATED] = (donated, True)
    out: dict[float, dict] = {}
    for rate in rates:
        out[rate] = {}
        for label, (rows, memory_on) in nodes.items():
            sim = AuditSim(rate, asks_per_epoch, traffic[label], params) if rate > 0 else None
            rng, audit_rng = random.Random(f"{seed}/{label}"), random.Random(f"{seed}/{label}/audits")
            out[rate][label] = [epochs_until_untrusted(run_epochs(rows, epochs, rng, memory_on, sim,
                                                                  audit_rng if sim else None), below)
                                for _ in range(runs)]
    return out


def trusted_epochs(scored: dict[str, list[dict]], epochs: int, runs: int, seed: int, asks_per_epoch: int,
                   flagged: float, labels: tuple[str, ...] = ("selective", "honest")) -> dict:
    """Epochs of `epochs` a node spends trusted when real asks, and so audits, reach it only while
    it is trusted (untrusted, it leaves every directory), with probation and without it
    (`probation_epochs` = 0: R alone decides, the rule before 2026-11-27). The selective cheater
    answers challenges well, so without probation it is trusted again one or two epochs after
    each time audits catch it. Both variants see the same draws (seeded per run), so the ratio is
    the probation's alone."""
    from gentorrent.config import REPUTATION

    traffic = real_traffic(scored, flagged)
    variants = {"probation": REPUTATION, "no_probation": replace(REPUTATION, probation_epochs=0)}
    out: dict[str, dict] = {}
    for label in labels:
        rows = scored.get(label)
        if not rows or label not in traffic:
            continue
        sim = AuditSim(AUDITS.rate, asks_per_epoch, traffic[label])
        out[label] = {}
        for name, params in variants.items():
            counts = sorted(_trusted_count(rows, sim, params, epochs, f"{seed}/trusted/{label}/{run}")
                            for run in range(runs))
            out[label][name] = {"mean": round(sum(counts) / len(counts), 2), "median": counts[len(counts) // 2],
                                "p90": counts[int(0.9 * (len(counts) - 1))], "max": counts[-1]}
        out[label]["ratio"] = round(out[label]["probation"]["mean"] / max(1e-9, out[label]["no_probation"]["mean"]), 3)
    return out


def _trusted_count(rows: list[dict], sim: AuditSim, params, epochs: int, seed: str) -> int:
    """Epochs one simulated node ends trusted: a challenge drawn from `rows` each epoch, folded
    with that epoch's audits only while the node is trusted."""
    import numpy as np

    from verifier.epochs import reputation as rep

    rng, audit_rng = random.Random(seed), random.Random(f"{seed}/a")
    draws = np.random.default_rng(audit_rng.getrandbits(64))
    state, count = rep.initial_state(params), 0
    for _ in range(epochs):
        cred = rng.choice(rows)["credibility"]
        if not state.untrusted:
            cred = sim.credibility(cred, audit_rng, draws)
        state = rep.update(state, cred, params)
        count += not state.untrusted
    return count


# --------------------------------------------------------------------------- the robust rule (modelled)

PER_EPOCH = 6  # challenges per node and epoch under the robust rule (the epoch machine is to send them)
HONEST_ABNORMAL = 0.02  # the per-reply abnormal rate an honest node must survive untrusted-free


def robust_rule(scored: dict[str, list[dict]], epochs: int, runs: int, seed: int, per_epoch: int = PER_EPOCH,
                abnormal: float = HONEST_ABNORMAL) -> dict:
    """Honest runs ever untrusted at a per-reply abnormal rate `abnormal`, and epochs to untrusted
    per cheater kind, under: today's rule (one challenge an epoch), `per_epoch` challenges judged
    by their lowest score, and `per_epoch` challenges judged by robust_credibility (the lowest
    ignored). Challenges only (no audits): the rule's own effect."""
    from gentorrent.config import REPUTATION

    honest = _honest_at_rate(scored.get("honest", []), abnormal)
    nodes = {"honest": honest, **{k: v for k, v in scored.items() if k != "honest"}}
    variants = {"one_challenge": (1, REPUTATION),
                f"{per_epoch}_challenges_lowest": (per_epoch, replace(REPUTATION, outliers_ignored=0)),
                f"{per_epoch}_challenges_robust": (per_epoch, REPUTATION)}
    below = _untrusted_below()
    out: dict = {"per_epoch": per_epoch, "honest_abnormal_rate": abnormal, "runs": runs, "epochs": epochs}
    for name, (m, params) in variants.items():
        res = {}
        for label, rows in nodes.items():
            if not rows:
                continue
            rng = random.Random(f"{seed}/robust/{label}")
            values = [epochs_until_untrusted(run_epochs(rows, epochs, rng, True, per_epoch=m, params=params), below)
                      for _ in range(runs)]
            d = distribution(values, epochs)
            res[label] = ({"ever_untrusted": runs - d["never"]} if label == "honest"
                          else {"within_5": d["within_5"], "median": d["median"], "never": d["never"]})
        out[name] = res
    return out


# --------------------------------------------------------------------------- the strongest selective cheater (modelled)

#: What tells a challenge from a user's ask on today's code (measured from outside on main, else
#: assumptions marked so), and the defence that takes each away. A FILTER marks real asks only
#: (a request with it is surely not a challenge): the share of real asks it marks. A FLAG marks
#: challenges: (share of challenges, share of real asks) it marks.
FILTERS = {  # name: (share of real asks marked, defence)
    "fields": (0.25, "profiles"),  # seed / stop / top_k / completions prompt: never in a challenge (share assumed)
    "sampling_values": (0.30, "profiles"),  # a temperature / top_p / max_tokens off the challenges' 10 / 4 / 9 values (assumed)
    "probing_window": (0.75, "times"),  # challenges arrive only in the public probing phase (~1/4 of an epoch, assumed)
}
FLAGS = {  # name: (share of challenges, share of real asks, defence)
    "corpus_lookup": (1.0, 0.001, "composed"),  # 800 of 800 challenges, 1 of 1,067 real prompts (measured)
    "foreign_history": (0.53, 0.01, "sessions"),  # turns it never wrote; real follow-ups come back to their writer
    "long_assistant_turn": (0.38, 0.0, "sessions"),  # an assistant turn longer than the API's default reply
}
DEFENCES = ("composed", "sessions", "profiles", "times", "robust")
ASKS = (0, 1, 5, 20, 200)
MIN_CHEATING = 0.5  # a cheater that answers more than half of its users honestly saves too little


@dataclass(frozen=True)
class Policy:
    """How the cheater answers: honestly on a share `tpr` of challenges and `fpr` of real asks."""

    name: str
    tpr: float
    fpr: float


def cheater_policies(defences: frozenset[str], composed_caught: float = 0.05,
                     composed_false: float = 0.01) -> list[Policy]:
    """The cheater's options given which defences are on: be honest on what the remaining filters
    let through (`passed`), or only on what the remaining flags mark among it; or, with nothing
    left, honest on a random half. A defended flag marks challenges as often as the realism bench
    measured (`composed_caught` of challenges at `composed_false` of real prompts) or not at all."""
    passed_real = 1.0
    for share, defence in FILTERS.values():
        if defence not in defences:
            passed_real *= 1.0 - share
    miss_c, miss_r = 1.0, 1.0
    for name, (tpr, fpr, defence) in FLAGS.items():
        if defence in defences:
            tpr, fpr = (composed_caught, composed_false) if name == "corpus_lookup" else (0.0, 0.0)
        miss_c *= 1.0 - tpr
        miss_r *= 1.0 - fpr
    options = [Policy("honest on what the filters pass", 1.0, passed_real),
               Policy("honest on flagged requests", 1.0 - miss_c, passed_real * (1.0 - miss_r)),
               Policy("honest on a random half", 0.5, 0.5)]
    return [p for p in options if p.fpr <= 1.0 - MIN_CHEATING] or [options[-1]]


def strongest_selective(scored: dict[str, list[dict]], epochs: int, runs: int, seed: int,
                        composed_caught: float = 0.05) -> dict:
    """Epochs to untrusted of the strongest selective cheater, per real asks per node and epoch
    (ASKS) and per set of defences: none (today's code), each alone, all. For each, the cheater
    takes the policy that keeps it trusted longest. Its cheap replies are the `random` kind's
    recorded ones, its honest ones the honest node's; audits at the committee's rate."""
    honest = [r["credibility"] for r in scored.get("honest", [])]
    cheap = [r["credibility"] for r in scored.get("random", [])]
    if not honest or not cheap:
        return {}
    sets = {"none": frozenset(), **{d: frozenset({d}) for d in DEFENCES}, "all": frozenset(DEFENCES)}
    out: dict = {"asks_per_node_epoch": list(ASKS), "runs": runs, "epochs": epochs, "audit_rate": AUDITS.rate,
                 "filters": {k: v[0] for k, v in FILTERS.items()},
                 "flags": {k: [v[0], v[1]] for k, v in FLAGS.items()}, "by_defences": {}}
    for name, defences in sets.items():
        per_asks = {}
        for asks in ASKS:
            best = None
            for policy in cheater_policies(defences, composed_caught):
                values = [_selective_run(policy, honest, cheap, asks, epochs, "robust" in defences,
                                         f"{seed}/sel/{name}/{asks}/{policy.name}/{r}") for r in range(runs)]
                d = distribution(values, epochs)
                mean = sum(epochs + 1 if v is None else v for v in values) / len(values)
                if best is None or mean > best[0]:
                    best = (mean, policy, d)
            _, policy, d = best
            per_asks[str(asks)] = {"policy": policy.name, "cheats_on": round(1 - policy.fpr, 3),
                                   "within_5": d["within_5"], "median": d["median"], "never": d["never"]}
        out["by_defences"][name] = per_asks
    return out


def _selective_run(policy: Policy, honest: list[float], cheap: list[float], asks: int, epochs: int,
                   robust: bool, seed: str) -> int | None:
    """One run: each epoch its challenges (PER_EPOCH under the robust rule, else one), each answered
    honestly with probability tpr, folded with audits of its real asks (honest with probability fpr)."""
    import numpy as np

    from gentorrent.config import REPUTATION
    from verifier.epochs import reputation as rep

    rng = random.Random(seed)
    draws = np.random.default_rng(rng.getrandbits(64))
    sim = AuditSim(AUDITS.rate, asks, RealTraffic(tuple(cheap), tuple(honest), policy.fpr)) if asks else None
    params = REPUTATION if robust else replace(REPUTATION, outliers_ignored=0)
    state = rep.initial_state(params)
    for t in range(1, epochs + 1):
        creds = [rng.choice(honest) if rng.random() < policy.tpr else rng.choice(cheap)
                 for _ in range(PER_EPOCH if robust else 1)]
        cred = rep.robust_credibility(creds, params)
        if sim is not None:
            cred = sim.credibility(cred, rng, draws)
        state = rep.update(state, cred, params)
        if state.reputation < params.untrusted_below:
            return t
    return None


def _untrusted_below() -> float:
    from gentorrent.config import REPUTATION

    return REPUTATION.untrusted_below


def epochs_until_untrusted(curve: list[float], below: float) -> int | None:
    return next((t for t, r in enumerate(curve) if r < below), None)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    p, z2 = k / n, z * z
    mid, half = (p + z2 / (2 * n)) / (1 + z2 / n), z * ((p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5) / (1 + z2 / n)
    return (max(0.0, mid - half), min(1.0, mid + half))


def distribution(values: list[int | None], epochs: int) -> dict:
    caught = sorted(v for v in values if v is not None)
    pct = (lambda q: caught[min(len(caught) - 1, int(q * len(caught)))] if caught else None)
    return {"runs": len(values), "never": len(values) - len(caught),
            "within_5": sum(1 for v in caught if v <= 5) / len(values), "median": pct(0.5), "p90": pct(0.9),
            "max": caught[-1] if caught else None,
            "histogram": {str(t): caught.count(t) for t in range(1, epochs + 1) if caught.count(t)}}


def _share_by_epoch(values: list[int | None], epochs: int) -> list[float]:
    return [sum(1 for v in values if v is not None and v <= x) / len(values) for x in range(epochs + 1)]


def plot(example: dict[str, list[float]], dists: dict[str, list[int | None]], by_rate: dict[float, dict],
         below: float, epochs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    for node, curve in example.items():
        left.plot(range(len(curve)), curve, "-" if node == "honest" else "--", label=node)
    left.axhline(below, color="grey", linestyle=":", linewidth=1)
    left.set(title="one run, challenges only (gamma = 1/5)", xlabel="epoch", ylabel="reputation", ylim=(-0.02, 1.02))
    xs = list(range(epochs + 1))
    for node, values in dists.items():
        middle.step(xs, _share_by_epoch(values, epochs), where="post", label=node)
    middle.axvline(5, color="grey", linestyle=":", linewidth=1)
    middle.set(title="share untrusted by epoch, challenges only", xlabel="epoch", ylabel="share of runs",
               ylim=(-0.02, 1.02))
    middle.legend(fontsize=7, loc="center right")
    for i, (rate, nodes) in enumerate(sorted(by_rate.items())):
        for node, style in (("selective", "-"), (REPLAY_UNIQUE, "--"), ("honest", ":")):
            if node in nodes:
                right.step(xs, _share_by_epoch(nodes[node], epochs), style, where="post", color=f"C{i}",
                           label=f"{node}, audit rate {rate:g}")
    right.axvline(5, color="grey", linestyle=":", linewidth=1)
    right.set(title="with audits of real replies (per audit rate)", xlabel="epoch", ylabel="share of runs",
              ylim=(-0.02, 1.02))
    right.legend(fontsize=6, loc="center right")
    fig.suptitle("Cheater detection from recorded real credibilities (SmolLM2-135M reference)")
    fig.tight_layout()
    FIGURE.parent.mkdir(exist_ok=True)
    fig.savefig(FIGURE, dpi=120)


def analyse(specs: list[dict], kinds: list[str], epochs: int, runs: int, seed: int,
            rates: tuple[float, ...] = AUDIT_RATES, asks_per_epoch: int = ASKS_PER_EPOCH,
            figure: bool = True) -> dict:
    """`figure`: write results/detection.png (a tiny run leaves the committed figure alone)."""
    from gentorrent.config import REPUTATION
    from verifier.epochs.scoring import calibrate_threshold

    scored = {label: score_rows(load_replies(label, specs)) for label in ["honest", *kinds]}
    scored = {k: v for k, v in scored.items() if v}
    from_cache = bool(scored)
    if from_cache:
        SCORES.write_text(json.dumps({"note": "per-reply credibilities; raw token scores in results/detection_cache",
                                      "nodes": scored}, indent=0))
        selective = _selective_accuracy()
    else:  # a checkout without the (gitignored) raw cache: the credibilities the last recording scored
        _progress(f"no recordings in {CACHE}: resampling the per-reply credibilities of {SCORES.name}")
        scored, selective = _recorded(["honest", *kinds])
    tau, below = REPUTATION.abnormal_threshold, REPUTATION.untrusted_below
    honest = [r["credibility"] for r in scored.get("honest", [])]
    fp = sum(1 for c in honest if c < tau)
    flagged = selective["flags_user_asks"] if selective else 0.0
    rates = tuple(sorted({0.0, AUDITS.rate, *rates}))
    by_rate = resample(scored, epochs, runs, seed, rates, asks_per_epoch, flagged)
    dists, audited = by_rate[0.0], by_rate[AUDITS.rate]
    example = {label: run_epochs(rows, epochs, random.Random(seed)) for label, rows in scored.items()}
    if figure:
        plot(example, dists, by_rate, below, epochs)
    cheaters = {k: distribution(v, epochs) for k, v in dists.items() if k != "honest"}
    with_audits = {k: distribution(v, epochs) for k, v in audited.items() if k != "honest"}
    lo, hi = wilson(fp, len(honest))
    pessimistic = _honest_at_rate(scored.get("honest", []), hi)
    pess_by_rate = resample({"honest": pessimistic}, epochs, runs, seed, rates, asks_per_epoch, 0.0) \
        if pessimistic else {}
    return {
        "bench": "detection", "epochs": epochs, "runs_per_node": runs, "tau": tau, "untrusted_below": below,
        "replies": {k: len(v) for k, v in scored.items()},
        "honest_false_positive": {"abnormal": fp, "of": len(honest), "rate": round(fp / max(1, len(honest)), 4),
                                  "wilson95": [round(lo, 4), round(hi, 4)]},
        "honest_runs_ever_untrusted": sum(1 for v in dists.get("honest", []) if v is not None),
        "honest_credibility_quantiles": {q: round(sorted(honest)[int(q * (len(honest) - 1))], 3)
                                         for q in (0.005, 0.05, 0.5)} if honest else {},
        "tau_suggested_from_honest": round(calibrate_threshold(honest), 3) if honest else None,
        "mean_credibility": {k: round(sum(r["credibility"] for r in v) / len(v), 3) for k, v in scored.items()},
        "epochs_until_untrusted": cheaters,
        "audits": {"asks_per_epoch": asks_per_epoch, "rate": AUDITS.rate, "cap_per_node_epoch":
                   AUDITS.max_per_node_epoch, "committee": COMMITTEE, "selective_flags_user_asks": flagged,
                   "epochs_until_untrusted": {k: {f: d[f] for f in ("never", "within_5", "median", "p90", "max")}
                                              for k, d in with_audits.items()},
                   "within_5_by_rate": {k: {str(r): distribution(by_rate[r][k], epochs)["within_5"] for r in rates}
                                        for k in dists if k != "honest"},
                   "median_by_rate": {k: {str(r): distribution(by_rate[r][k], epochs)["median"] for r in rates}
                                      for k in dists if k != "honest"},
                   "honest_runs_ever_untrusted_by_rate": {str(r): sum(1 for v in by_rate[r].get("honest", [])
                                                                      if v is not None) for r in rates},
                   "honest_abnormal_at_wilson_upper": {
                       "abnormal_share": round(sum(1 for r in pessimistic if r["credibility"] < tau)
                                               / max(1, len(pessimistic)), 4),
                       "runs_ever_untrusted_by_rate": {str(r): sum(1 for v in d["honest"] if v is not None)
                                                       for r, d in pess_by_rate.items()}}},
        "trusted_epochs_audited_only_while_trusted": trusted_epochs(scored, epochs, runs, seed, asks_per_epoch, flagged),
        "goal_met_without_audits": _goal(cheaters, dists),
        "goal_met": _goal(with_audits, audited),
        "robust_rule": robust_rule(scored, epochs, runs, seed),
        "strongest_selective_cheater": strongest_selective(scored, epochs, max(20, runs // 5), seed,
                                                           _composed_caught()),
        "selective_cheater": selective,
        "figure": str(FIGURE.relative_to(ROOT)), "resampled_from_recorded_scores": True,
        "scores_from": "recordings" if from_cache else SCORES.name,
        "audit_fold": {"honest_abnormal_bound": AUDITS.honest_abnormal_bound, "honest_alpha": AUDITS.honest_alpha},
    }


def _composed_caught() -> float:
    """The share of composed challenges the best lookup or the classifier catches at 1 % false
    alarms, as bench/challenge_realism.py last measured it (results/challenge_realism.json)."""
    composed = ROOT / "results" / "challenge_realism_composed.json"  # `--sets composed`, when measured
    path = composed if composed.exists() else ROOT / "results" / "challenge_realism.json"
    try:
        result = json.loads(path.read_text())
        caught = [r["caught_at_1pct_false_alarms"] for r in result["lookups"]["composed"].values()]
        return max([*caught, result["composed"]["caught_at_1pct"]])
    except (OSError, KeyError, ValueError):
        return 0.05  # the goal, when the realism bench has not measured composed challenges


def _recorded(labels: list[str]) -> tuple[dict[str, list[dict]], dict | None]:
    """The committed per-reply credibilities, and the selective cheater's accuracy as the run
    that recorded them measured it (its text model lives in the cache too)."""
    if not SCORES.exists():
        raise SystemExit(f"no recordings in {CACHE} and no {SCORES}: run without --no-record first")
    nodes = json.loads(SCORES.read_text())["nodes"]
    previous = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    return {k: nodes[k] for k in labels if nodes.get(k)}, previous.get("selective_cheater")


def _honest_at_rate(rows: list[dict], share: float) -> list[dict]:
    """The honest replies padded with replies scored 0 until a `share` of them is abnormal: the
    honest node at the upper end of its measured false-positive interval (none of the recorded
    honest replies is abnormal, so the recorded pool alone cannot show what the audit fold does
    to an unlucky honest node)."""
    if not rows:
        return []
    zeros = 0
    while zeros / (len(rows) + zeros) < share:
        zeros += 1
    return rows + [{**rows[i % len(rows)], "credibility": 0.0} for i in range(zeros)]


def _goal(cheaters: dict[str, dict], dists: dict[str, list[int | None]]) -> bool:
    """Every cheater untrusted within 5 epochs in every run, no honest run ever untrusted."""
    return all(d["within_5"] == 1.0 for d in cheaters.values()) and not any(v is not None
                                                                          for v in dists.get("honest", []))


def _selective_accuracy() -> dict | None:
    """The selective cheater's settings and how often it takes the bench's challenges, and its
    users' asks, for challenges (measured when it was built: `selective_cheater`)."""
    return json.loads(SELECTIVE.read_text()) if SELECTIVE.exists() else None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--honest", type=int, default=200, help="honest replies recorded")
    p.add_argument("--per-cheater", type=int, default=30, help="replies recorded per cheater kind")
    p.add_argument("--kinds", default=",".join(CHEATERS))
    p.add_argument("--quick", action="store_true", help="smoke run: 12 honest, 4 per cheater, 50 runs")
    p.add_argument("--tiny", action="store_true",
                   help="seconds, what make test runs: --no-record, 20 runs, no figure written")
    p.add_argument("--no-record", action="store_true", help="analyse the cache only")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--epochs", type=int, default=EPOCHS_RUN)
    p.add_argument("--runs", type=int, default=1000, help="simulated 35-epoch runs per node")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--asks-per-epoch", type=int, default=ASKS_PER_EPOCH,
                   help="real asks one node answers per epoch (audits: Binomial(asks, rate))")
    p.add_argument("--audit-rates", default=",".join(f"{r:g}" for r in AUDIT_RATES),
                   help="audit rates swept (0: challenges only; the committee's own rate is always added)")
    args = p.parse_args(argv)
    if args.quick:
        args.honest, args.per_cheater, args.runs = 12, 4, 50
    if args.tiny:
        args.no_record, args.runs = True, 20
    kinds = [k for k in args.kinds.split(",") if k]
    if not args.no_record:
        asyncio.run(record(args.honest, args.per_cheater, kinds, args.concurrency))
    qfile = CACHE / "questions.json"
    specs = request_specs(len(json.loads(qfile.read_text())), max(args.honest, args.per_cheater), 18) \
        if qfile.exists() else []  # (no recordings: analyse() resamples the committed credibilities)
    rates = tuple(float(r) for r in args.audit_rates.split(",") if r)
    return analyse(specs, kinds, args.epochs, args.runs, args.seed, rates, args.asks_per_epoch,
                   figure=not args.tiny)


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
