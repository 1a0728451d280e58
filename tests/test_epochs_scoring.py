"""Scoring math on a synthetic reference model whose exact distributions we know.

Each position of a synthetic "reference" has a Zipf-like distribution over a 300-token vocabulary
with varying entropy (some positions nearly deterministic, some creative). Honest nodes sample
from it with the challenge's sampling parameters; cheaters sample from something else. The
reference's top-20 view is what the scorer sees, exactly like vLLM's prompt_logprobs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gentorrent.config import REPUTATION, SCORING
from verifier.epochs import reputation as rep
from verifier.epochs import scoring as sc

VOCAB = 300
K = 20


def reference_logits(rng: np.random.Generator, n: int) -> np.ndarray:
    sharpness = rng.uniform(0.3, 3.0, size=(n, 1))  # low = creative, high = near-deterministic
    base = -sharpness * np.log(np.arange(1, VOCAB + 1))[None, :] * 1.6
    base = base + rng.normal(0, 0.3, size=(n, VOCAB))
    perm = np.argsort(rng.random((n, VOCAB)), axis=1)  # which token id is likely varies
    return np.take_along_axis(base, np.argsort(perm, axis=1), axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def sample(rng, logits, temperature=0.7, top_p=1.0, greedy=False):
    if greedy or temperature == 0:
        return logits.argmax(axis=1)
    lp = log_softmax(logits / temperature)
    out = []
    for row in lp:
        p = np.exp(row)
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, top_p) + 1)]
        q = p[keep] / p[keep].sum()
        out.append(int(rng.choice(keep, p=q)))
    return np.array(out)


def view(logits: np.ndarray, tokens: np.ndarray) -> sc.TokenScores:
    """What the verifier's single pass returns: untempered logprob, rank and top-K."""
    lp = log_softmax(logits)
    logprob, rank, top = [], [], []
    for row, tok in zip(lp, tokens):
        order = np.argsort(-row)
        logprob.append(float(row[tok]))
        rank.append(int(np.where(order == tok)[0][0]) + 1)
        top.append({int(t): float(row[t]) for t in order[:K]})
    return sc.TokenScores(logprob, rank, top)


def replies(kind: str, n_replies=40, n_tokens=128, seed=0, temperature=0.7, top_p=1.0):
    rng = np.random.default_rng(seed)
    reports = []
    for _ in range(n_replies):
        ref = reference_logits(rng, n_tokens)
        if kind == "honest":
            toks = sample(rng, ref, temperature, top_p)
        elif kind == "greedy":  # the reference model itself, but cheaply decoded: bland
            toks = sample(rng, ref, greedy=True)
        elif kind == "other_model":  # a different model: correlated but wrong distributions
            toks = sample(rng, ref * 0.6 + rng.normal(0, 2.0, ref.shape), temperature, top_p)
        elif kind == "bland_small":  # a cheaper model decoded cold: likely-looking tokens
            toks = sample(rng, ref + rng.normal(0, 1.5, ref.shape), 0.3, top_p)
        elif kind == "random":
            toks = rng.integers(0, VOCAB, n_tokens)
        else:
            raise ValueError(kind)
        reports.append(sc.score_reply(view(ref, toks), sc.SamplingSpec(temperature, top_p)))
    return reports


def test_honest_sampling_scores_high_and_cheaters_low():
    honest = [r.credibility for r in replies("honest", seed=1)]
    assert np.mean(honest) > 0.9 and min(honest) >= 0.5
    for kind in ("greedy", "other_model", "bland_small", "random"):
        cheat = [r.credibility for r in replies(kind, seed=2)]
        assert np.median(cheat) < 0.3, kind
        assert np.mean(np.array(cheat) < REPUTATION.abnormal_threshold) > 0.6, kind


@pytest.mark.parametrize("seed", [21])
def test_scores_drive_reputation_cheaters_out_within_5_epochs_honest_never(seed):
    """One challenge per epoch, 35 epochs, gamma = 1/5: the goal of bench/detection.py."""
    for kind in ("honest", "honest", "greedy", "other_model", "bland_small", "random"):
        state, untrusted_at = rep.initial_state(), None
        for epoch, report in enumerate(replies(kind, n_replies=35, seed=seed), start=1):
            state = rep.update(state, report.credibility)
            if state.untrusted and untrusted_at is None:
                untrusted_at = epoch
        if kind == "honest":
            assert untrusted_at is None
        else:
            assert untrusted_at is not None and untrusted_at <= 5, (kind, untrusted_at)
        seed += 100


def test_inverse_perplexity_alone_prefers_the_bland_cheater():
    """The paper's 1/PPL ranks a greedy or cold cheaper model above the honest node."""
    honest = np.mean([r.inv_ppl for r in replies("honest", seed=3)])
    greedy = np.mean([r.inv_ppl for r in replies("greedy", seed=3)])
    assert greedy > honest
    paper = replace(SCORING, mode="inv_ppl")
    rng = np.random.default_rng(3)
    ref = reference_logits(rng, 128)
    s = view(ref, sample(rng, ref, greedy=True))
    assert sc.score_reply(s, params=paper).credibility == pytest.approx(sc.score_reply(s).inv_ppl)
    assert sc.score_reply(s).credibility < 0.3  # the combined score does catch it


def test_honest_noise_statistics_are_centred():
    reports = replies("honest", n_replies=80, seed=4)
    z = [r.gap / r.gap_se for r in reports if r.gap_se > 0]
    assert abs(np.mean(z)) < 0.5 and 0.5 < np.std(z) < 1.6  # approximately standard normal
    assert abs(np.mean([r.top1_share - r.expected_top1_share for r in reports])) < 0.03
    assert all(r.out_of_support_share == 0 for r in reports)


def test_nucleus_and_greedy_sampling_are_honoured():
    honest_nucleus = [r.credibility for r in replies("honest", seed=5, top_p=0.8)]
    assert np.mean(honest_nucleus) > 0.9
    honest_greedy = [r.credibility for r in replies("greedy", seed=5, temperature=0.0)]
    assert min(honest_greedy) == pytest.approx(1.0)
    # sampling at T = 0.7 when the challenge asked for greedy decoding breaks the support
    rng = np.random.default_rng(6)
    ref = reference_logits(rng, 64)
    sampled = view(ref, sample(rng, ref, 0.7))
    report = sc.score_reply(sampled, sc.SamplingSpec(temperature=0.0))
    assert report.out_of_support_share > 0.15 and report.credibility < 0.1


def test_hand_computed_single_position():
    # one position, top-2 = {1: log .6, 2: log .3}, tail mass .1, T = 1, the token is id 2
    top = {1: math.log(0.6), 2: math.log(0.3)}
    s = sc.TokenScores([math.log(0.3)], [2], [top])
    r = sc.score_reply(s, sc.SamplingSpec(temperature=1.0))
    mu = (0.6 * math.log(0.6) + 0.3 * math.log(0.3)) / 0.9
    assert r.gap == pytest.approx(math.log(0.3) - mu)
    assert r.expected_top1_share == pytest.approx(0.6 / 0.9) and r.top1_share == 0.0
    assert r.expected_tail_share == pytest.approx(0.1)
    assert r.inv_ppl == pytest.approx(0.3)
    assert r.credibility == pytest.approx(1.0)  # one token: nothing is significant


def test_empty_and_malformed_input():
    assert sc.score_reply(sc.TokenScores([], [], [])).credibility == 0.0
    with pytest.raises(sc.ScoringError):
        sc.TokenScores([-1.0], [1, 2], [{1: -1.0}])
    with pytest.raises(sc.ScoringError):
        sc.TokenScores([0.5], [1], [{1: -1.0}])
    with pytest.raises(sc.ScoringError):
        sc.TokenScores([float("nan")], [1], [{1: -1.0}])
    with pytest.raises(sc.ScoringError):
        sc.TokenScores([-1.0], [0], [{1: -1.0}])
    with pytest.raises(sc.ScoringError):
        sc.TokenScores([-1.0], [1], [{}])
    with pytest.raises(sc.ScoringError):
        sc.SamplingSpec(temperature=-1)
    with pytest.raises(sc.ScoringError):
        sc.SamplingSpec(top_p=0)
    with pytest.raises(sc.ScoringError):
        sc.score_reply(sc.TokenScores([-1.0], [1], [{1: -1.0}]), params=replace(SCORING, mode="x"))


def test_adapter_from_vllm_positions():
    positions = [{5: (-0.1, 1), 7: (-2.5, 2), 9: (-6.0, 40)}, {3: (-0.7, 1), 4: (-0.9, 2)}]
    s = sc.token_scores_from_positions([9, 4], positions, top_k=20)
    assert list(s.logprob) == [-6.0, -0.9] and list(s.rank) == [40, 2]
    assert s.top_logprobs[0] == {5: -0.1, 7: -2.5}
    with pytest.raises(sc.ScoringError):
        sc.token_scores_from_positions([1], [{5: (-0.1, 1)}])


def test_calibrate_threshold():
    honest = [r.credibility for r in replies("honest", n_replies=40, seed=7)]
    tau = sc.calibrate_threshold(honest, quantile=0.0, margin=0.8)
    assert tau == pytest.approx(0.8 * min(honest))
    with pytest.raises(sc.ScoringError):
        sc.calibrate_threshold([])



def test_an_honest_short_reply_is_not_condemned_by_the_dispersion_tests_heavy_tail():
    """The demo's honest 0.340 was a dispersion z of 4.1 and nothing else, on a
    reply of at most 96 tokens (the devnet's cap). tests/data/honest_dispersion_outlier.json is an
    honest 48-token reply (tokens drawn from the very distributions the reference reports, T = 1,
    by a seeded simulation: ~1 reply in 400 of that length was condemned): a few in-top-k tokens
    far below their positions' means dominate the sum of squared gaps, whose normal z then cries
    wolf. Clipped at `dispersion_clip_nats` (expectation and variance exact under the clip), no
    token moves the sum by more than the clip squared (fails with the clip at 0)."""
    import json
    from dataclasses import replace as _replace
    from pathlib import Path

    from gentorrent.config import SCORING
    from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

    case = json.loads((Path(__file__).parent / "data" / "honest_dispersion_outlier.json").read_text())
    s = case["scores"]
    scores = TokenScores([t[0] for t in s], [t[1] for t in s], [dict(enumerate(t[2])) for t in s])
    sampling = SamplingSpec(case["temperature"], case["top_p"])
    unclipped = score_reply(scores, sampling, _replace(SCORING, dispersion_clip_nats=0.0))
    assert unclipped.credibility < 0.5 and unclipped.z["dispersion"] > 4
    assert max(v for k, v in unclipped.z.items() if k != "dispersion") < SCORING.z_tolerance
    assert score_reply(scores, sampling).credibility == 1.0


def test_above_temperature_one_the_tail_test_never_expects_fewer_tail_tokens_than_honest_sampling():
    """At T > 1 small tokens gain most, so the tail's tempered weight is NOT at
    most tail_mass * p_min^(1/T - 1) (that is a lower bound there). Twenty tokens of p = 0.02 and a
    tail of 0.6 spread over 30,000 tokens of 2e-5: honest sampling at T = 1.2 leaves the top-k
    82 % of the time; the old bound expected 60 % and condemned the honest reply (fails without
    the bound over TAIL_VOCAB)."""
    import math

    from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

    top = {j: math.log(0.02) for j in range(20)}
    n, in_top = 200, 36  # 82 % of 200 outside the top-k, as honest sampling gives
    logprob = [math.log(2e-5)] * (n - in_top) + [math.log(0.02)] * in_top
    rank = [21] * (n - in_top) + [1 + j % 20 for j in range(in_top)]
    report = score_reply(TokenScores(logprob, rank, [top] * n), SamplingSpec(1.2, 1.0))
    assert report.z["tail"] < 3.0 and report.credibility == 1.0, report.z
