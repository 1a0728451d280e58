"""The routing simulator: a faithful SGLang baseline, a documented engine, a fair comparison.

Fast (a few seconds), seeded. The SGLang tests pin the behaviours the shipped router has and
an earlier baseline here did not: a character cap enforced only by the periodic eviction,
least-recently-used leaves evicted first, character (not token) match rates, its two balance
thresholds, and ties that do not all go to worker 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sims import routing
from sims.routing_engine import PROFILES, SimNode, block_keys, cpu_profile, Job
from sims.routing_workloads import RequestFactory, generate
from sims.sglang_router import ApproxTree, SGLangConfig, SGLangRouter, char_lengths


def toks(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int64)


def ids_with_chars(n: int, chars: int, start: int = 0) -> np.ndarray:
    """n token ids whose SGLang text has `chars` characters each."""
    pool = np.flatnonzero(char_lengths(np.arange(40_000)) == chars)
    return pool[start:start + n].astype(np.int64)


# ------------------------------------------------------------------------- SGLang baseline


def test_tree_cap_is_enforced_only_by_the_periodic_eviction_lru_leaves_first():
    cfg = SGLangConfig(max_tree_size=60, eviction_interval_secs=120)
    r = SGLangRouter(2, seed=1, config=cfg)
    old, hot = ids_with_chars(20, 4), ids_with_chars(20, 4, start=100)
    r.tree.insert(old, char_lengths(old), 0, now_ms=1_000)
    r.tree.insert(hot, char_lengths(hot), 0, now_ms=2_000)
    assert r.tree.char_count[0] == 160  # over the 60-char cap: nothing evicted yet
    r.select(hot[:15], loads=[0, 0], now=100.0)  # before the interval: still nothing
    assert r.tree.char_count[0] > cfg.max_tree_size and r.evictions == 0
    r.select(toks(7, 8, 9), loads=[0, 0], now=121.0)  # the eviction thread has run
    assert r.tree.char_count[0] <= cfg.max_tree_size
    assert r.tree.prefix_match(hot, char_lengths(hot), 0)[0] > 0  # recently used: kept
    assert r.tree.prefix_match(old, char_lengths(old), 0)[0] == 0  # least recently: gone
    assert r.tree.tenant_chars() == r.tree.char_count


def test_match_rate_counts_characters_not_tokens():
    r = SGLangRouter(3, seed=4)
    short, long_ = ids_with_chars(40, 1), ids_with_chars(10, 7, start=50)
    r.select(np.concatenate([short, ids_with_chars(5, 2)]), loads=[0, 0, 0], now=0.0)
    first = r.tree.prefix_match(short, char_lengths(short), 0)[1]
    # 40 shared tokens of 1 char then 10 new tokens of 7 chars: 80 % of the tokens match
    # but only 40 / 110 = 36 % of the characters (still > 0.3); with 14 new tokens: 29 %
    assert r.select(np.concatenate([short, long_]), [0, 0, 0], 1.0) == first
    more = np.concatenate([short, ids_with_chars(14, 7, start=60)])
    assert r.select(more, [0, 0, 0], 2.0) != first  # under cache_threshold: smallest tree
    assert r.decisions == {"balance": 0, "cache_hit": 1, "cache_miss": 2}


def test_balance_thresholds_are_absolute_and_relative():
    r = SGLangRouter(3, seed=2)
    prompt = ids_with_chars(50, 4)
    holder = r.select(prompt, [0, 0, 0], 0.0)
    loads = [0, 0, 0]
    loads[holder] = 64  # max - min = 64: not > balance_abs_threshold
    assert r.select(prompt, loads, 1.0) == holder
    loads = [10, 10, 10]
    loads[holder] = 75  # 65 > 64 and 75 > 10 * 1.5: imbalanced, least loaded, first on a tie
    assert r.select(prompt, loads, 2.0) == min(i for i in range(3) if i != holder)
    assert r.decisions["balance"] == 1


def test_cold_ties_follow_the_maps_order_not_the_lowest_index():
    firsts = {SGLangRouter(4, seed=s).select(ids_with_chars(30, 3), [0] * 4, 0.0) for s in range(12)}
    assert len(firsts) > 1  # the DashMap's hash order, not always worker 0
    tree = ApproxTree(4, seed=3)  # then the smallest tree: every worker gets one before any gets two
    got = set()
    for k in range(4):
        p = ids_with_chars(8, 4, start=200 + 10 * k)
        w = tree.smallest_tenant()
        tree.insert(p, char_lengths(p), w, k)
        got.add(w)
    assert got == {0, 1, 2, 3}


# ------------------------------------------------------------------------- engine model


def test_engine_profiles_have_an_attention_term_and_a_decode_floor():
    for name in ("h100-llama3-8b", "a100-llama3-8b"):
        p = PROFILES[name]
        assert p.prefill_s(16_000) > 2.05 * p.prefill_s(8_000)  # quadratic attention
        assert p.prefill_s(8_000, cached=7_900) < 0.05 * p.prefill_s(8_000)
        assert p.decode_step_s(1, 100) >= p.floor_s  # never below the weight-read floor
        assert p.decode_step_s(64, 8_000) > 2 * p.decode_step_s(1, 8_000)  # KV reads grow
    h, a = PROFILES["h100-llama3-8b"], PROFILES["a100-llama3-8b"]
    assert 2.5 < a.prefill_s(8_000) / h.prefill_s(8_000) < 3.5
    measured = cpu_profile()
    assert measured is not None and measured.attn_s_per_pair > 0  # results/engine_profile_cpu.json


def test_prefix_cache_hit_skips_prefill_in_the_node_model():
    p = PROFILES["a100-llama3-8b"]
    node = SimNode(0, p)
    prompt = np.arange(6_000) % 40_000
    for rid in range(2):
        job = Job(rid, 0.0, len(prompt), 2, block_keys(prompt, p.block_tokens), p.block_tokens)
        t = 100.0 * rid
        node.arrive(job, t)
        while node.active:
            t = node.next_time()
            node.process(t)
        assert job.first_token > 0
    assert node.cache.match(block_keys(prompt, p.block_tokens)) == len(prompt) // p.block_tokens


# ------------------------------------------------------------------------- the comparison


def test_ours_never_uses_peers_it_has_not_heard_from_by_gossip():
    """No fresher information than gossip gives: before the first round (node 0's, at a
    quarter of the 5-s interval with 4 nodes) nothing can be forwarded; after it, some is."""
    cfg = routing.SimConfig(nodes=4, seed=3)
    reqs = generate("tooluse", 40.0, 200, 3, RequestFactory(3))
    early = [r for r in reqs if r.arrival < 1.2]
    res = routing.simulate(cfg, "ours", early, 40.0, "tooluse")
    assert res.n > 20 and res.forward_rate == 0.0
    assert routing.simulate(cfg, "ours", reqs, 40.0, "tooluse").forward_rate > 0.2


def test_ours_beats_no_forwarding_on_a_shared_prefix_trace():
    cfg = routing.SimConfig(nodes=4, seed=2)
    factory = RequestFactory(2)
    rate = round(routing.nocache_capacity("tooluse", cfg, factory), 2)
    reqs = generate("tooluse", rate, 400, 2, factory)
    nf = routing.simulate(cfg, "no_forward", reqs, rate, "tooluse")
    ours = routing.simulate(cfg, "ours", reqs, rate, "tooluse")
    assert ours.hit_rate > nf.hit_rate + 0.1
    assert ours.mean_s < 0.6 * nf.mean_s and ours.p99_s < 0.6 * nf.p99_s
    assert 0 < ours.forward_rate < 1 and ours.tree_hit_rate > 0.5


def test_quick_sweep_writes_every_output_and_one_json_line(tmp_path, capsys):
    assert routing.main(["--quick", "--out", str(tmp_path)]) == 0
    head = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert head["groups"] == 2 and set(head["workloads"]) == {"tooluse", "chat"}
    for name in ("routing_quick.md", "routing_quick.csv", "routing_quick_goals.png",
                 "routing_quick_latency.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = routing.load_csv(tmp_path / "routing_quick.csv")
    assert {r.policy for r in rows} == set(routing.POLICIES) | {"ideal"}
    ideal = {r.workload: r for r in rows if r.policy == "ideal"}
    for r in rows:  # the bound is a bound
        assert r.mean_s >= ideal[r.workload].mean_s * 0.999, r
    # a second run resumes from the CSV: nothing to simulate again
    assert routing.main(["--quick", "--out", str(tmp_path)]) == 0
    assert len(routing.load_csv(tmp_path / "routing_quick.csv")) == len(rows)


@pytest.mark.parametrize("workload", ["chat", "sysprompt", "rag"])
def test_operator_workloads_share_prefixes_as_described(workload):
    reqs = generate(workload, 5.0, 200, 1)
    heads = {r.tokens[:256].tobytes() for r in reqs}
    assert len(heads) < len(reqs) / 4  # few distinct openings: shared system prompts / docs
    if workload == "chat":
        follow = [r for r in reqs if r.follow_up is not None]
        assert follow and all(np.array_equal(r.follow_up.tokens[:len(r.tokens) + len(r.reply)],
                                             np.concatenate([r.tokens, r.reply])) for r in follow)
