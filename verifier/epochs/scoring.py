"""Credibility of one challenge reply, from ONE teacher-forced pass of the reference model.

Input: for every reply token, the reference model's log-probability of that token given the
prompt and the reply so far, its rank, and the reference's top-k log-probabilities at that
position (vLLM ``prompt_logprobs=k`` over prompt + reply: one forward pass, never one request
per token as in the paper's Algorithm 3). Output: a :class:`ScoreReport` whose ``credibility``
in [0, 1] feeds the reputation update.

Why 1/perplexity alone is not enough. The paper scores a reply by 1/PPL = exp(mean log p).
That rewards *likely* text, not *honestly sampled* text: a cheaper model (or the same model run
greedily, or a canned generic answer) produces blander, more predictable tokens than the
reference would sample at the user's temperature, so its 1/PPL can be as high as or higher than
an honest node's, while an honest reply to a creative prompt has a low 1/PPL simply because the
prompt admits many answers. The absolute value depends on the prompt more than on the node.

The combined score therefore compares the reply with what *honest sampling from the reference
under the challenge's sampling parameters* would produce at the very same positions. For
position i let q_i be the reference's next-token distribution after temperature / top-k / top-p
(computed from the top-k logprobs, the mass beyond them kept as one "tail" outcome). Under
honest sampling each statistic below is a sum of martingale differences, so its mean is 0 and
its standard error is known from q_i alone:

  gap        mean over in-top-k tokens of log p(t_i) - E_{q_i}[log p | top-k]   (two-sided:
             too unlikely = wrong/pruned/noisy model; too likely = bland cheaper model/greedy)
  top-1      share of in-top-k tokens that are the reference's top-1, minus its expectation
             sum q_i(top1 | top-k) (two-sided: greedy-agreement)
  tail       share of tokens outside the reference top-k, minus its expectation (one-sided)
  dispersion mean squared gap minus its expectation (one-sided: a mix of bland and odd tokens)
  support    share of tokens the sampler could never have produced (outside the nucleus /
             top-k / not the argmax under greedy decoding), beyond a small allowance for ties
  relevance  mean log p of the first `relevance_tokens` tokens (every token, the tail counted at
             its upper bound) minus its expectation (one-sided: too unlikely). A reply to another
             prompt (a replayed one) opens with tokens the prompt does not lead to; teacher
             forcing adapts the reference after a few tokens, so a whole-reply mean dilutes
             exactly the evidence this test keeps separate
  opening tail  the count of those opening tokens outside the reference top-k against its
             expectation (one-sided, Poisson: the words of another topic are rarely in the top-k)

Each test costs nothing within ``z_tolerance`` standard errors plus a slack for cross-engine
numeric noise, then multiplies the credibility by exp(-excess / scale); the support test scales
linearly to 0 at ``max_out_of_support``. Credibility = product of the seven factors: ~1.0 for an
honest reply, falling towards 0 the further and the more significantly the reply departs from
honest sampling. ``ScoringParams.mode = "inv_ppl"`` gives the paper's score for comparison.
All parameters live in gentorrent.config.ScoringParams; bench/detection.py calibrates them and
tau on honest sampling noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Mapping, Sequence

from gentorrent.config import CHALLENGE_TOKENS, MODEL_NODE, SCORING, ScoringParams

__all__ = [
    "ScoringError",
    "SamplingSpec",
    "TokenScores",
    "ScoreReport",
    "score_reply",
    "credibility",
    "token_scores_from_positions",
    "calibrate_threshold",
]

LOGPROB_FLOOR = -50.0  # the paper's epsilon for a token the reference gives no probability
TAIL_VOCAB = 2**18  # more tokens than any served model's vocabulary (the tail bound above T = 1)
_GREEDY_T = 1e-5  # vLLM treats temperatures below this as greedy decoding


class ScoringError(ValueError):
    """Malformed scoring input (mismatched lengths, non-finite or positive log-probs, ...)."""


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling parameters the challenge was sent with (the same as users use)."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k truncation (vLLM convention is -1)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ScoringError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ScoringError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class TokenScores:
    """The reference's view of a reply, one entry per reply token.

    logprob[i]       log p_ref(t_i | prompt, t_<i), untempered (vLLM's raw logprobs)
    rank[i]          1-based rank of t_i in that distribution (1 = the reference's argmax)
    top_logprobs[i]  the reference's top-k at position i: token id -> untempered logprob
    """

    logprob: Sequence[float]
    rank: Sequence[int]
    top_logprobs: Sequence[Mapping[int, float]]

    def __post_init__(self) -> None:
        n = len(self.logprob)
        if len(self.rank) != n or len(self.top_logprobs) != n:
            raise ScoringError("logprob, rank and top_logprobs must have one entry per token")
        limit = max(MODEL_NODE.max_new_tokens, CHALLENGE_TOKENS) * 4
        if n > limit:
            raise ScoringError(f"{n} tokens is more than the {limit} a reply may have")
        for i in range(n):
            lp, r, top = self.logprob[i], self.rank[i], self.top_logprobs[i]
            if not isinstance(lp, (int, float)) or math.isnan(lp) or lp > 1e-6:
                raise ScoringError(f"token {i}: logprob must be <= 0, got {lp!r}")
            if not isinstance(r, int) or r < 1:
                raise ScoringError(f"token {i}: rank must be an int >= 1, got {r!r}")
            if not top or len(top) > 1000:
                raise ScoringError(f"token {i}: top_logprobs must hold 1..1000 entries")
            for v in top.values():
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v > 1e-6:
                    raise ScoringError(f"token {i}: top logprob must be finite and <= 0, got {v!r}")


@dataclass(frozen=True)
class ScoreReport:
    """Every statistic of one reply; `credibility` is what the reputation update uses."""

    n_tokens: int
    mean_logprob: float
    inv_ppl: float  # the paper's score: 1 / perplexity
    top1_share: float  # of the in-top-k, in-support tokens: greedy agreement
    topk_share: float  # of all tokens
    expected_top1_share: float  # what honest sampling gives for top1_share
    gap: float  # nats per in-support, in-top-k token; 0 for honest sampling
    gap_se: float
    tail_share: float
    expected_tail_share: float
    dispersion: float  # mean squared gap minus its expectation; 0 for honest sampling
    out_of_support_share: float
    z: Mapping[str, float]  # the tests' z-scores (0 = exactly what honest sampling gives)
    factors: Mapping[str, float]
    credibility: float
    # an upper bound on the log-probability that honest sampling gives exactly these tokens:
    # whether a repeat of this output for another prompt proves a replay (verifier/epochs/repeats.py)
    log_prob_bound: float = 0.0


@dataclass(frozen=True)
class _Position:
    """Honest-sampling expectations at one position."""

    mu: float  # E[log p | sampled token in top-k]
    var: float
    m4: float  # fourth central moment, for the dispersion test
    q_top1: float  # P(reference top-1 | sampled token in top-k)
    q_tail: float  # probability the sampler leaves the reference top-k
    floor: float  # lowest logprob the sampler can emit (minus ties); -inf if the tail is kept
    mu_all: float = 0.0  # E[log p] over every outcome, the tail counted at its upper bound
    var_all: float = 0.0
    lowest: float = 0.0  # the lowest log p an outcome is counted at (the tail's bound)
    # the dispersion statistic clipped at `clip` nats (ScoringParams.dispersion_clip_nats), exact under q:
    disp_c: float = 0.0  # E[min((log p - mu)^2, clip^2) | in top-k]
    disp_c_var: float = 0.0


def _position(top_sorted: list[float], sampling: SamplingSpec, tie: float, clip: float = 0.0) -> _Position:
    if sampling.temperature < _GREEDY_T:
        return _Position(top_sorted[0], 0.0, 0.0, 1.0, 0.0, top_sorted[0] - tie, top_sorted[0], 0.0, top_sorted[0])
    inv_t = 1.0 / sampling.temperature
    outcomes = [(lp * inv_t, lp, False) for lp in top_sorted]  # (log weight, log p, is_tail)
    mass = math.fsum(math.exp(lp) for lp in top_sorted)
    tail_mass = 1.0 - mass
    if sampling.top_k > 0:
        outcomes = outcomes[: sampling.top_k]
    if tail_mass > 1e-9 and (sampling.top_k <= 0 or sampling.top_k > len(top_sorted)):
        # tokens beyond the top-k each have p <= p_min: at T <= 1 their tempered weight is at most
        # tail_mass * p_min^(1/T - 1) (exact at T = 1). Above T = 1 that is a LOWER bound (small
        # tokens gain most from a high temperature): the weight is at most that of the tail
        # spread evenly over a vocabulary of TAIL_VOCAB, tail_mass^(1/T) * TAIL_VOCAB^(1 - 1/T),
        # and the tail test, one-sided, must never expect fewer tail tokens than honest sampling
        # gives. Their log p is taken as log p_min.
        p_min_log = top_sorted[-1]
        weight = math.log(tail_mass) + (inv_t - 1.0) * p_min_log
        if inv_t < 1.0:
            weight = max(weight, inv_t * math.log(tail_mass) + (1.0 - inv_t) * math.log(TAIL_VOCAB))
        outcomes.append((weight, p_min_log, True))
    top = max(w for w, _, _ in outcomes)
    weights = [math.exp(w - top) for w, _, _ in outcomes]
    total = math.fsum(weights)
    probs = [w / total for w in weights]
    if sampling.top_p < 1.0:  # smallest prefix (tail last) whose mass reaches top_p
        kept, cum = 0, 0.0
        while kept < len(probs) and cum < sampling.top_p:
            cum += probs[kept]
            kept += 1
        outcomes, probs = outcomes[:kept], probs[:kept]
        total = math.fsum(probs)
        probs = [p / total for p in probs]
    q_tail = sum(p for p, (_, _, is_tail) in zip(probs, outcomes) if is_tail)
    in_k = [(p, lp) for p, (_, lp, is_tail) in zip(probs, outcomes) if not is_tail]
    z = math.fsum(p for p, _ in in_k) or 1.0
    mu = math.fsum(p * lp for p, lp in in_k) / z
    var = max(0.0, math.fsum(p * (lp - mu) ** 2 for p, lp in in_k) / z)
    m4 = math.fsum(p * (lp - mu) ** 4 for p, lp in in_k) / z
    floor = -math.inf if q_tail > 0 else min(lp for _, lp in in_k) - tie
    q_top1 = (probs[0] / z) if not outcomes[0][2] else 0.0  # given in top-k: exact, tail-free
    mu_all = math.fsum(p * lp for p, (_, lp, _) in zip(probs, outcomes))
    var_all = max(0.0, math.fsum(p * (lp - mu_all) ** 2 for p, (_, lp, _) in zip(probs, outcomes)))
    lowest = min(lp for _, lp, _ in outcomes)
    position = _Position(mu, var, m4, min(1.0, q_top1), q_tail, floor, mu_all, var_all, lowest)
    if clip <= 0:
        return position
    disp_c, disp_c_var = _moments([(p / z, min((lp - mu) ** 2, clip * clip)) for p, lp in in_k])
    return replace(position, disp_c=disp_c, disp_c_var=disp_c_var)


def _moments(weighted: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean and variance of a discrete distribution given as (probability, value) pairs."""
    mean = math.fsum(p * v for p, v in weighted)
    return mean, max(0.0, math.fsum(p * (v - mean) ** 2 for p, v in weighted))


def _z(observed: float, expected: float, se_sum: float, n: int, slack: float, two_sided: bool) -> float:
    """How many (slack-widened) standard errors a per-token mean departs from honest sampling."""
    if n == 0:
        return 0.0
    diff = (observed - expected) / n
    se = math.sqrt((se_sum / n) ** 2 + slack**2)
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return abs(z) if two_sided else max(0.0, z)


def _poisson_z(count: int, expected: float) -> float:
    """How surprising `count` rare events are when `expected` were due, as a one-sided z-score.

    The opening tokens hold few out-of-top-k tokens, so a normal approximation would cry wolf on
    two of them; the Poisson tail is exact enough (and conservative: a sum of Bernoullis varies
    less than the Poisson of the same mean).
    """
    if count <= 0:
        return 0.0
    lam = max(expected, 1e-12)
    term, below = math.exp(-lam), 0.0
    for j in range(count):
        below += term
        term *= lam / (j + 1)
    p_value = max(1e-300, 1.0 - below) if below < 0.999999 else max(1e-300, term)  # P(X >= count)
    return -NormalDist().inv_cdf(p_value) if p_value < 0.5 else 0.0


def score_reply(
    scores: TokenScores, sampling: SamplingSpec = SamplingSpec(), params: ScoringParams = SCORING
) -> ScoreReport:
    """All statistics and the credibility of one reply (see the module docstring)."""
    n = len(scores.logprob)
    if n < max(1, params.min_tokens):
        empty = {"gap": 0.0, "top1": 0.0, "tail": 0.0, "dispersion": 0.0, "relevance": 0.0, "opening_tail": 0.0,
                 "support": 0.0}
        return ScoreReport(n, LOGPROB_FLOOR, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, empty, empty, 0.0)
    lps = [max(LOGPROB_FLOOR, float(v)) for v in scores.logprob]
    mean_lp = math.fsum(lps) / n
    gap_obs = gap_exp = gap_var = disp_obs = disp_exp = disp_var = 0.0
    n_gap = n_top1 = n_topk = n_tail = n_oos = n_tail_pos = 0
    top1_exp = top1_var = tail_exp = tail_var = rel_obs = rel_var = rel_tail_exp = 0.0
    rel_tail = 0
    disp_raw = 0.0  # the unclipped statistic the report shows
    clip = params.dispersion_clip_nats
    n_rel = min(n, params.relevance_tokens)
    bound = 0.0
    for i, (lp, rank, top) in enumerate(zip(lps, scores.rank, scores.top_logprobs)):
        top_sorted = sorted((max(LOGPROB_FLOOR, v) for v in top.values()), reverse=True)
        pos = _position(top_sorted, sampling, params.tie_nats, params.dispersion_clip_nats)
        bound += _token_log_bound(lp, rank, top_sorted, sampling, params.tie_nats)
        if i < n_rel:  # relevance: the opening tokens must follow from the prompt itself
            rel_obs += max(lp, pos.lowest) - pos.mu_all
            rel_var += pos.var_all
            rel_tail_exp += pos.q_tail
            rel_tail += rank > len(top_sorted)
        in_topk = rank <= len(top_sorted)
        n_topk += in_topk
        if pos.q_tail > 0:
            n_tail_pos += 1
            n_tail += not in_topk
            tail_exp += pos.q_tail
            tail_var += pos.q_tail * (1.0 - pos.q_tail)
        if lp < pos.floor or (not in_topk and pos.q_tail == 0):
            n_oos += 1
            continue
        if in_topk:
            # conditional on the token being in the top-k, q_i restricted to it is exact (the
            # tail's size only enters the one-sided tail test), so these tests are unbiased
            n_top1 += rank == 1
            top1_exp += pos.q_top1
            top1_var += pos.q_top1 * (1.0 - pos.q_top1)
            d = lp - pos.mu
            n_gap += 1
            gap_obs += d
            gap_var += pos.var
            disp_raw += d * d - pos.var
            if clip > 0:  # bounded summands: one rare token moves the sum by at most clip^2
                disp_obs += min(d * d, clip * clip)
                disp_exp += pos.disp_c
                disp_var += pos.disp_c_var
            else:
                disp_obs += d * d
                disp_exp += pos.var
                disp_var += max(0.0, pos.m4 - pos.var**2)
    gap_se = math.sqrt(gap_var) / n_gap if n_gap else 0.0
    zs = {
        "gap": _z(gap_obs, gap_exp, math.sqrt(gap_var), n_gap, params.gap_slack_nats, True),
        "top1": _z(n_top1, top1_exp, math.sqrt(top1_var), n_gap, params.top1_slack, True),
        "tail": _z(n_tail, tail_exp, math.sqrt(tail_var), n_tail_pos, params.tail_slack, False),
        "dispersion": _z(disp_obs, disp_exp, math.sqrt(disp_var), n_gap, params.dispersion_slack, False),
        "relevance": _z(-rel_obs, 0.0, math.sqrt(rel_var), n_rel, params.relevance_slack_nats, False),
        "opening_tail": _poisson_z(rel_tail, rel_tail_exp + params.relevance_tail_slack),
    }
    factors = {
        name: math.exp(-max(0.0, z - params.z_tolerance) / params.z_scale) for name, z in zs.items()
    }
    oos_share = n_oos / n
    span = max(1e-9, params.max_out_of_support - params.support_allowance)
    factors["support"] = min(1.0, max(0.0, 1.0 - (oos_share - params.support_allowance) / span))
    inv_ppl = math.exp(mean_lp)
    if params.mode == "inv_ppl":
        cred = inv_ppl
    elif params.mode == "combined":
        cred = math.prod(factors.values())
    else:
        raise ScoringError(f"unknown scoring mode {params.mode!r}")
    return ScoreReport(
        n_tokens=n,
        mean_logprob=mean_lp,
        inv_ppl=inv_ppl,
        top1_share=n_top1 / n_gap if n_gap else 0.0,
        topk_share=n_topk / n,
        expected_top1_share=top1_exp / n_gap if n_gap else 0.0,
        gap=gap_obs / n_gap if n_gap else 0.0,
        gap_se=gap_se,
        tail_share=n_tail / n_tail_pos if n_tail_pos else 0.0,
        expected_tail_share=tail_exp / n_tail_pos if n_tail_pos else 0.0,
        dispersion=disp_raw / n_gap if n_gap else 0.0,
        out_of_support_share=oos_share,
        z=zs,
        factors=factors,
        credibility=min(1.0, max(0.0, cred)),
        log_prob_bound=bound,
    )


def _token_log_bound(lp: float, rank: int, top_sorted: list[float], sampling: SamplingSpec, tie: float) -> float:
    """An upper bound on log q(t) for the tempered, truncated distribution q the node sampled t
    from: q(t) = p(t)^(1/T) / Z, Z the sum of p^(1/T) over the tokens the sampler kept. Z is at
    least t's own weight plus the weights of the top-k tokens surely kept with t: all of them
    without truncation; under top_p or top_k (which keep a prefix of the likeliest tokens) those
    clearly likelier than t. Engines differ by up to `tie` nats, so t's log p counts `tie` higher
    and the others' `tie` lower."""
    if sampling.temperature < _GREEDY_T:  # greedy: only the argmax can come out
        return 0.0 if lp >= top_sorted[0] - tie else LOGPROB_FLOOR
    inv_t = 1.0 / sampling.temperature
    others = [v for i, v in enumerate(top_sorted) if i != rank - 1]
    if sampling.top_p < 1.0 or sampling.top_k > 0:
        others = [v for v in others if v - tie >= lp + tie]
    mine = (lp + tie) * inv_t
    weights = [mine] + [(v - tie) * inv_t for v in others]
    top = max(weights)
    return min(0.0, mine - top - math.log(math.fsum(math.exp(w - top) for w in weights)))


def credibility(
    scores: TokenScores, sampling: SamplingSpec = SamplingSpec(), params: ScoringParams = SCORING
) -> float:
    """The credibility in [0, 1] of one reply (shortcut for score_reply(...).credibility)."""
    return score_reply(scores, sampling, params).credibility


def token_scores_from_positions(
    reply_token_ids: Sequence[int],
    positions: Sequence[Mapping[int, tuple[float, int]]],
    top_k: int = SCORING.top_k,
) -> TokenScores:
    """Adapter from vLLM ``prompt_logprobs`` of the reply positions to :class:`TokenScores`.

    ``positions[i]`` maps token id -> (logprob, rank) at reply position i, as vLLM returns it
    (the top-k entries plus the actual token). The engine shell converts its Logprob objects to
    these tuples and slices off the prompt positions.
    """
    if len(reply_token_ids) != len(positions):
        raise ScoringError("one position dict per reply token is needed")
    logprob, rank, top = [], [], []
    for i, (tok, entries) in enumerate(zip(reply_token_ids, positions)):
        if tok not in entries:
            raise ScoringError(f"position {i}: the reply token {tok} has no logprob")
        lp, r = entries[tok]
        logprob.append(float(lp))
        rank.append(int(r))
        top.append({t: float(v) for t, (v, rr) in entries.items() if rr <= top_k})
        if not top[-1]:
            raise ScoringError(f"position {i}: no top-{top_k} entry")
    return TokenScores(logprob, rank, top)


def calibrate_threshold(honest_credibilities: Sequence[float], quantile: float = 0.005, margin: float = 0.8) -> float:
    """tau from honest sampling noise: `margin` times the `quantile` of honest credibilities.

    An honest reply then falls below tau with probability about `quantile`, and one abnormal
    value in a window of W = 5 is never punished at gamma = 1/5 (only c >= 2 is).
    """
    values = sorted(float(v) for v in honest_credibilities)
    if not values:
        raise ScoringError("no honest credibility to calibrate on")
    if not 0 <= quantile < 1 or not 0 < margin <= 1:
        raise ScoringError("quantile must be in [0, 1) and margin in (0, 1]")
    idx = min(len(values) - 1, int(quantile * len(values)))
    return margin * values[idx]
