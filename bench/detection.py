"""Cheater detection: reputation of 2 honest nodes and each cheater over 35 epochs, gamma in
{1, 1/3, 1/5} (the paper's Fig. 12), from REAL credibilities of real nodes.

    .venv/bin/python bench/detection.py [--per-node 6] [--reuse] [--kinds pruned,noisy,...]

Two stages, said out loud:

1. Recording (real parts, slow): challenges are drawn from the traffic model as the committee
   draws them (real user conversations, verifier.epochs.challenges.draw_challenge); every node - two honest ones
   (independent samples of the honest model) and one `gt-model serve --dishonest KIND` per cheater
   - answers each question with the challenge request a verifier sends (the same bytes the
   overlay would carry), and the reference scores every reply in one teacher-forced pass
   (verifier.epochs.scoring, the committee's credibility). Scores are cached in
   results/detection_scores.json (--reuse skips nodes already recorded).
2. Replay (pure): 35 epochs per gamma, each node's C(T) drawn (seeded) from ITS recorded
   credibilities, through verifier.epochs.reputation exactly as FinalizeBlock applies it. 35
   live epochs per gamma on this 2-core machine would take hours; the reputation math is the
   committee's own code either way.

Prints ONE JSON line (epochs until each cheater is untrusted per gamma, lowest honest reputation,
the honest credibility quantiles and the tau they suggest) and writes results/detection.png.
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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gentorrent.traffic.model import ChatRequest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCORES = ROOT / "results" / "detection_scores.json"
FIGURE = ROOT / "results" / "detection.png"
CHEATERS = ("pruned", "noisy", "other-model", "random", "replay", "selective")
GAMMAS = {"1": 1.0, "1/3": 1 / 3, "1/5": 1 / 5}
EPOCHS_RUN = 35
MODEL = "smollm2-135m"


def _progress(msg: str) -> None:
    print(f"[bench/detection] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- recording (real)


class Served:
    """One `gt-model serve` process (optionally dishonest) on 127.0.0.1."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self.home = Path(tempfile.mkdtemp(prefix=f"gt-detect-{kind or 'honest'}-"))
        extra = ["--dishonest", kind] if kind else []
        self.log = open(self.home / "serve.out", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "model_node.cli", "serve", "--model", MODEL,
                                      "--home", str(self.home), "--listen", "127.0.0.1:0", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)

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


async def _questions(reference, n: int, seed: bytes) -> list:
    """n challenges drawn as the committee draws them (the traffic model), replies capped at
    EPOCHS.challenge_max_tokens so the bench fits a CPU."""
    from gentorrent.config import EPOCHS
    from verifier.epochs.challenges import ChallengeError, draw_challenge, prompt_key
    from verifier.epochs.runner import challenge_pool

    pool = challenge_pool()
    out, keys, attempt = [], set(), 0
    while len(out) < n and attempt < 20 * n:
        attempt += 1
        try:
            question = draw_challenge(pool, seed, "bench", attempt, max_tokens_cap=EPOCHS.challenge_max_tokens)
        except ChallengeError:
            continue
        if prompt_key(question.text) not in keys:
            keys.add(prompt_key(question.text))
            out.append(question)
    return out


async def _record_node(reference, info: dict, questions: list, label: str) -> list[dict]:
    from gentorrent.crypto import tls
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from verifier.epochs.probe_format import challenge_request
    from verifier.epochs.scoring import SamplingSpec, score_reply

    channel = await tls.connect(info["address"], Path(info["cert_file"]).read_bytes(), timeout=60)
    rows = []
    try:
        stub = rpc.ModelNodeStub(channel)
        for q in questions:
            request = challenge_request(q, MODEL)
            chunks = [c async for c in stub.Generate(request, timeout=900)]
            tokens = [t for c in chunks for t in c.token_ids]
            report = score_reply(await reference.score(request, tokens), SamplingSpec(q.temperature, q.top_p))
            rows.append({"credibility": report.credibility, "inv_ppl": report.inv_ppl, "tokens": report.n_tokens,
                         "z": report.z, "out_of_support": report.out_of_support_share})
            _progress(f"{label}: credibility {report.credibility:.3f} 1/ppl {report.inv_ppl:.3f} "
                      f"z {({k: round(v, 1) for k, v in report.z.items()})}")
    finally:
        await channel.close()
    return rows


async def record(per_node: int, kinds: list[str], reuse: bool) -> dict:
    from verifier.epochs.reference import RemoteReference

    data = json.loads(SCORES.read_text()) if SCORES.exists() else {"questions": [], "nodes": {}}
    wanted = ["honest-1", "honest-2", *kinds]
    todo = [k for k in wanted if not (reuse and len(data["nodes"].get(k, [])) >= per_node)]
    if not todo:
        return data
    ref_proc = Served(None)
    try:
        ref_info = await asyncio.to_thread(ref_proc.wait)
        reference = RemoteReference(ref_info["address"], Path(ref_info["cert_file"]).read_bytes())
        if len(data["questions"]) < per_node:
            data["questions"] = [q.to_dict() for q in await _questions(reference, per_node, os.urandom(32))]
            _progress(f"{len(data['questions'])} challenges drawn from the traffic model")
        questions = [ChatRequest.from_dict(q) if isinstance(q, dict) else ChatRequest.question(q)
                     for q in data["questions"][:per_node]]
        for label in todo:
            if label.startswith("honest"):  # an honest node runs the very same model
                data["nodes"][label] = await _record_node(reference, ref_info, questions, label)
            else:
                proc = Served(label)
                try:
                    info = await asyncio.to_thread(proc.wait)
                    data["nodes"][label] = await _record_node(reference, info, questions, label)
                finally:
                    proc.stop()
            SCORES.parent.mkdir(exist_ok=True)
            SCORES.write_text(json.dumps(data, indent=1))
        await reference.close()
    finally:
        ref_proc.stop()
    return data


# --------------------------------------------------------------------------- replay (pure)


def replay(scores: dict[str, list[float]], gamma: float, epochs: int, seed: int) -> dict[str, list[float]]:
    """Reputation curves: C(T) of each node drawn from its recorded credibilities."""
    from gentorrent.config import REPUTATION
    from verifier.epochs import reputation as rep

    params = replace(REPUTATION, gamma=gamma)
    rng = random.Random(seed)
    curves = {}
    for node in sorted(scores):
        state, curve = rep.initial_state(params), [params.initial_reputation]
        for _ in range(epochs):
            state = rep.update(state, rng.choice(scores[node]), params)
            curve.append(state.reputation)
        curves[node] = curve
    return curves


def epochs_until_untrusted(curve: list[float], below: float) -> int | None:
    return next((t for t, r in enumerate(curve) if r < below), None)


def plot(all_curves: dict[str, dict[str, list[float]]], below: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_curves), figsize=(5 * len(all_curves), 4), sharey=True)
    for ax, (gname, curves) in zip(axes, all_curves.items()):
        for node, curve in curves.items():
            style = "-" if node.startswith("honest") else "--"
            ax.plot(range(len(curve)), curve, style, label=node, linewidth=1.6 if style == "-" else 1.1)
        ax.axhline(below, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"gamma = {gname}")
        ax.set_xlabel("epoch")
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("reputation")
    axes[-1].legend(fontsize=7, loc="center right")
    fig.suptitle("Reputation over epochs from recorded real credibilities (SmolLM2-135M reference)")
    fig.tight_layout()
    FIGURE.parent.mkdir(exist_ok=True)
    fig.savefig(FIGURE, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    from gentorrent.config import REPUTATION
    from verifier.epochs.scoring import calibrate_threshold

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-node", type=int, default=6, help="challenges recorded per node")
    p.add_argument("--kinds", default=",".join(CHEATERS))
    p.add_argument("--reuse", action="store_true", help="keep nodes already in results/detection_scores.json")
    p.add_argument("--epochs", type=int, default=EPOCHS_RUN)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    data = asyncio.run(record(args.per_node, kinds, args.reuse))
    scores = {n: [r["credibility"] for r in rows] for n, rows in data["nodes"].items()
              if n.startswith("honest") or n in kinds}
    below = REPUTATION.untrusted_below
    all_curves, untrusted_at, lowest_honest = {}, {}, {}
    for gname, gamma in GAMMAS.items():
        curves = replay(scores, gamma, args.epochs, args.seed)
        all_curves[gname] = curves
        untrusted_at[gname] = {n: epochs_until_untrusted(c, below) for n, c in curves.items() if not n.startswith("honest")}
        lowest_honest[gname] = round(min(min(c) for n, c in curves.items() if n.startswith("honest")), 4)
    plot(all_curves, below)
    honest = sorted(v for n, vals in scores.items() if n.startswith("honest") for v in vals)
    at_goal = untrusted_at["1/5"]
    return {
        "bench": "detection", "epochs": args.epochs, "per_node_recorded": args.per_node,
        "mean_credibility": {n: round(sum(v) / len(v), 3) for n, v in scores.items()},
        "epochs_until_untrusted": untrusted_at, "lowest_honest_reputation": lowest_honest,
        "goal_met_gamma_1_5": all(v is not None and v <= 5 for v in at_goal.values())
        and lowest_honest["1/5"] >= below,
        "tau": REPUTATION.abnormal_threshold, "tau_suggested_from_honest": round(calibrate_threshold(honest), 3),
        "honest_min_credibility": round(honest[0], 3), "figure": str(FIGURE.relative_to(ROOT)),
        "replayed_from_recorded_scores": True,
    }


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
