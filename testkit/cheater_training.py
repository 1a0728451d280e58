"""Train the selective cheater's text model the way a real cheater would, and measure it.

    .venv/bin/python -m testkit.cheater_training --reference NODE_JSON --out MODEL.json [--n 150]

The cheater generates labelled challenges itself: the challenge generator (verifier/epochs/
challenges.py) and the reference model are public, so it draws question seeds, has the
reference write questions exactly as a leader would, and labels them "challenge"; the prompts
its own users sent (testkit/user_prompts.py stands in for them) are "user". The model is
a class-balanced logistic regression on word unigrams and bigrams (model_node/selective.py
evaluates it; scikit-learn trains it here, off the node). Prints ONE JSON line: cross-validated accuracy, the
share of challenges it recognises (TPR) and of user prompts it mistakes for challenges (FPR),
and the same on an independent held-out set of challenges when one is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from pathlib import Path

from model_node.selective import TextModel, features
from testkit.user_prompts import USER_PROMPTS

__all__ = ["challenge_questions", "cross_validate", "rates", "train_text_model"]


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


async def challenge_questions(reference, n: int, seed: bytes, label: str = "bench") -> list[str]:
    """`n` distinct questions written by the reference from seeded meta-prompts (as a leader does)."""
    from verifier.epochs.challenges import (ChallengeError, build_meta_prompt, clean_question, draw_question_seed,
                                            prompt_key)

    async def one(attempt: int) -> str | None:
        try:
            return clean_question(await reference.write(build_meta_prompt(draw_question_seed(seed, label, attempt)),
                                                        attempt))
        except ChallengeError:
            return None

    out, keys, attempt = [], set(), 0
    while len(out) < n and attempt < 20 * n:
        batch = await asyncio.gather(*(one(attempt + i) for i in range(16)))
        attempt += 16
        for question in batch:
            if question and prompt_key(question) not in keys and len(out) < n:
                keys.add(prompt_key(question))
                out.append(question)
    return out


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


async def _generate(node_json: Path, n: int) -> list[str]:
    from verifier.epochs.reference import RemoteReference

    info = json.loads(node_json.read_text())
    reference = RemoteReference(info["address"], Path(info["cert_file"]).read_bytes())
    try:
        return await challenge_questions(reference, n, os.urandom(32), "cheater")
    finally:
        await reference.close()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", type=Path, help="node.json of a running honest `gt-model serve`")
    p.add_argument("--questions", type=Path, help="use (or write) this JSON list of generated challenges")
    p.add_argument("--held-out", type=Path, help="a JSON list of challenges generated independently")
    p.add_argument("--out", type=Path, required=True, help="where the trained text model goes")
    p.add_argument("--n", type=int, default=150)
    args = p.parse_args(argv)
    if args.questions and args.questions.exists():
        challenges = json.loads(args.questions.read_text())
    else:
        challenges = asyncio.run(_generate(args.reference, args.n))
        if args.questions:
            args.questions.write_text(json.dumps(challenges, indent=1))
    model = train_text_model(challenges, list(USER_PROMPTS))
    model.save(args.out)
    out = {"bench": "selective_text_model", "cross_validated": cross_validate(challenges, list(USER_PROMPTS))}
    if args.held_out:
        out["held_out"] = rates(model, json.loads(args.held_out.read_text()), [])
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
