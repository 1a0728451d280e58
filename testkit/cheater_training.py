"""Train the selective cheater's text model the way a real cheater would, and measure it.

    .venv/bin/python -m testkit.cheater_training --out MODEL.json [--n 150]

The cheater generates labelled challenges itself: the traffic model and the corpus challenges
are drawn from are public (gentorrent.traffic), so it draws challenges exactly as a leader
would, with seeds of its own, and labels them "challenge"; the prompts its own users sent
are "user" (`served_prompts`: user messages of the held-out pool, the conversations no
challenge is drawn from, which stand for real traffic throughout the benchmarks; the small
hand-written testkit/user_prompts.py serves the unit tests). The model is
a class-balanced logistic regression on word unigrams and bigrams (testkit/selective.py
evaluates it; scikit-learn trains it here, off the node). Prints ONE JSON line: cross-validated accuracy, the
share of challenges it recognises (TPR) and of user prompts it mistakes for challenges (FPR),
and the same on an independent held-out set of challenges when one is given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

from testkit.selective import TextModel, features

__all__ = ["challenge_questions", "cross_validate", "rates", "train_text_model", "served_prompts",
           "operating_threshold"]


def train_text_model(challenges: list[str], users: list[str], c: float = 1.0) -> TextModel:
    """Class-balanced logistic regression on feature presence, exported as a TextModel."""
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = DictVectorizer()
    x = vectorizer.fit_transform([{f: 1 for f in features(t)} for t in [*challenges, *users]])
    fit = LogisticRegression(C=c, max_iter=5000, class_weight="balanced").fit(
        x, [1] * len(challenges) + [0] * len(users))
    weights = {name: float(w) for name, w in zip(vectorizer.get_feature_names_out(), fit.coef_[0]) if w != 0}
    return TextModel(weights, prior=float(fit.intercept_[0]))


def challenge_questions(n: int, seed: bytes, label: str = "bench") -> list[str]:
    """`n` distinct challenge texts drawn exactly as a leader draws them (the public traffic model
    over the public corpus: gentorrent.traffic.challenge), with a seed of the cheater's own."""
    from gentorrent.traffic.challenge import draw_challenge
    from gentorrent.traffic.model import TrafficError
    from verifier.epochs.challenges import prompt_key
    from verifier.epochs.runner import challenge_pool

    pool = challenge_pool()  # the one cached index of the public challenge pool
    out, keys, attempt = [], set(), 0
    while len(out) < n and attempt < 20 * n:
        attempt += 1
        try:
            text = draw_challenge(pool, seed, label, attempt).text
        except TrafficError:
            continue
        if prompt_key(text) not in keys:
            keys.add(prompt_key(text))
            out.append(text)
    return out


def served_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` prompts of the users a node serves: distinct user messages of the held-out pool."""
    from gentorrent.traffic.corpus import load_corpus
    from gentorrent.traffic.model import TrafficPool

    messages = TrafficPool.build(load_corpus().holdout).user_messages()
    return random.Random(seed).sample(messages, min(n, len(messages)))


def operating_threshold(user_scores: list[float], false_alarms: float) -> float:
    """The lowest threshold that at most a share `false_alarms` of users' scores exceed: where a
    cheater sets its detector, trading the real asks it serves honestly for challenges caught."""
    ranked = sorted(user_scores, reverse=True)
    allowed = int(false_alarms * len(ranked))
    return ranked[allowed] if allowed < len(ranked) else float("-inf")


def rates(model: TextModel, challenges: list[str], users: list[str]) -> dict:
    tp = sum(1 for t in challenges if model.log_odds(t) > 0)
    fp = sum(1 for t in users if model.log_odds(t) > 0)
    n = len(challenges) + len(users)
    return {"tpr": round(tp / max(1, len(challenges)), 3), "fpr": round(fp / max(1, len(users)), 3),
            "accuracy": round((tp + len(users) - fp) / max(1, n), 3), "challenges": len(challenges),
            "users": len(users)}


def cross_validate(challenges: list[str], users: list[str], folds: int = 5, seed: int = 0) -> dict:
    """k-fold estimate of how well the cheater tells its own generated challenges from users
    (each fold trains on the others and is judged at log-odds 0, the cheater's threshold)."""
    rng = random.Random(seed)
    c, u = rng.sample(challenges, len(challenges)), rng.sample(list(users), len(users))
    tp = fp = 0
    for k in range(folds):
        test_c, test_u = c[k::folds], u[k::folds]
        train_c = [t for i, t in enumerate(c) if i % folds != k]
        train_u = [t for i, t in enumerate(u) if i % folds != k]
        model = train_text_model(train_c, train_u)
        tp += sum(1 for t in test_c if model.log_odds(t) > 0)
        fp += sum(1 for t in test_u if model.log_odds(t) > 0)
    n = len(c) + len(u)
    return {"tpr": round(tp / len(c), 3), "fpr": round(fp / len(u), 3),
            "accuracy": round((tp + len(u) - fp) / n, 3), "folds": folds, "challenges": len(c), "users": len(u)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=Path, help="use (or write) this JSON list of generated challenges")
    p.add_argument("--held-out", type=Path, help="a JSON list of challenges generated independently")
    p.add_argument("--out", type=Path, required=True, help="where the trained text model goes")
    p.add_argument("--n", type=int, default=150)
    args = p.parse_args(argv)
    if args.questions and args.questions.exists():
        challenges = json.loads(args.questions.read_text())
    else:
        challenges = challenge_questions(args.n, os.urandom(32), "cheater")
        if args.questions:
            args.questions.write_text(json.dumps(challenges, indent=1))
    users = served_prompts(300)
    model = train_text_model(challenges, users)
    model.save(args.out)
    out = {"bench": "selective_text_model", "cross_validated": cross_validate(challenges, users)}
    if args.held_out:
        out["held_out"] = rates(model, json.loads(args.held_out.read_text()), [])
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
