"""The detection bench's resampling folds audits of real replies into each epoch (light: a
synthetic pool of replies, no vLLM, no cache)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("detection_bench", Path(__file__).resolve().parents[1]
                                               / "bench" / "detection.py")
detection = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = detection  # bench/ is scripts, not a package
_spec.loader.exec_module(detection)

EPOCHS, RUNS = 12, 40


def _rows(label: str, credibility: float, n: int = 16) -> list[dict]:
    """n recorded replies of one node, each to its own prompt with its own output."""
    return [{"i": i, "temperature": 0.7, "tokens": 64, "credibility": credibility, "log_prob_bound": -60.0,
             "prompt_hash": f"{i:016x}", "output_hash": f"{hash((label, i)) & (2**64 - 1):016x}"} for i in range(n)]


def _synthetic() -> dict[str, list[dict]]:
    """Honest replies score 1, the cheap (`random`) ones 0, and the selective cheater answers
    every challenge honestly (it recognised them all)."""
    return {"honest": _rows("honest", 1.0), "random": _rows("random", 0.0), "selective": _rows("selective", 1.0)}


def _mean_epochs(values: list[int | None]) -> float:
    return sum(EPOCHS + 1 if v is None else v for v in values) / len(values)


def test_audits_of_real_replies_catch_the_selective_cheater_that_challenges_miss():
    by_rate = detection.resample(_synthetic(), EPOCHS, RUNS, seed=3, rates=(0.0, 0.05), asks_per_epoch=200,
                                 flagged=0.1)
    without, audited = by_rate[0.0]["selective"], by_rate[0.05]["selective"]
    assert all(v is None for v in without)  # challenges alone never catch it
    assert all(v is not None for v in audited)
    assert _mean_epochs(audited) < _mean_epochs(without)
    assert all(v is None for rate in by_rate for v in by_rate[rate]["honest"])


def test_the_selective_cheaters_real_traffic_is_cheap_unless_flagged():
    traffic = detection.real_traffic(_synthetic(), flagged=1.0)["selective"]
    assert traffic.cheap == (0.0,) * 16 and traffic.honest == (1.0,) * 16
    assert {traffic.draw(random.Random(s)) for s in range(20)} == {1.0}  # it flags every ask: always honest


def test_challenges_made_of_donated_asks_catch_the_selective_cheater_without_audits():
    """Modelled: a donated challenge is a real user's prompt, so the cheater answers it as it
    answers users (cheaply, save its false alarms), and challenges alone catch it."""
    rows = detection.donated_challenge_rows(_synthetic(), flagged=0.2)
    assert sum(r["credibility"] == 1.0 for r in rows) == 4 and sum(r["credibility"] == 0.0 for r in rows) == 16
    by_rate = detection.resample(_synthetic(), EPOCHS, RUNS, seed=3, rates=(0.0,), asks_per_epoch=200, flagged=0.0)
    assert all(v is None for v in by_rate[0.0]["selective"])  # it spots every corpus challenge
    assert all(v is not None for v in by_rate[0.0][detection.SELECTIVE_DONATED])  # and no donated one
    assert detection.donated_challenge_rows({"selective": _rows("selective", 1.0)}, 0.1) == []


def test_probation_shortens_the_time_a_selective_cheater_spends_trusted_and_costs_honest_nodes_nothing():
    """Audits reach a node only while it is trusted; the selective cheater answers challenges
    honestly. Without probation it is trusted again soon after each catch; with it, less often."""
    out = detection.trusted_epochs(_synthetic(), 35, RUNS, seed=3, asks_per_epoch=200, flagged=0.0)
    selective, honest = out["selective"], out["honest"]
    assert selective["probation"]["mean"] < selective["no_probation"]["mean"] and selective["ratio"] < 1.0
    assert selective["probation"]["max"] < 35
    assert honest["probation"] == honest["no_probation"] and honest["probation"]["mean"] == 35


def test_several_challenges_and_a_robust_statistic_spare_an_honest_node_with_a_two_percent_abnormal_rate():
    """Modelled: one challenge an epoch untrusts an honest node that the scorer
    calls abnormal on 2 % of its replies in some runs; six, two outliers ignored, in none."""
    scored = {"honest": _rows("honest", 1.0, 200), "random": _rows("random", 0.0)}
    out = detection.robust_rule(scored, 35, 100, seed=5)
    assert out["one_challenge"]["honest"]["ever_untrusted"] > 0
    assert out[f"{detection.PER_EPOCH}_challenges_robust"]["honest"]["ever_untrusted"] == 0
    assert out[f"{detection.PER_EPOCH}_challenges_robust"]["random"]["within_5"] == 1.0


def test_the_strongest_selective_cheater_escapes_todays_challenges_and_not_all_the_defences():
    scored = {"honest": _rows("honest", 1.0), "random": _rows("random", 0.0)}
    out = detection.strongest_selective(scored, 20, 30, seed=5)["by_defences"]
    assert out["none"]["0"]["never"] == 30  # no real asks: today's challenges never catch it
    assert out["composed"]["0"]["never"] == 30  # the filters still tell it when to be honest
    assert out["all"]["0"]["within_5"] >= 0.9  # nothing left to tell: it cheats blind and is caught
    assert out["all"]["5"]["within_5"] >= out["none"]["5"]["within_5"]


def test_the_cheater_drops_a_signal_the_defences_took_away():
    none = {p.name: p for p in detection.cheater_policies(frozenset())}
    assert none["honest on flagged requests"].tpr == 1.0  # the corpus lookup finds every challenge
    everything = detection.cheater_policies(frozenset(detection.DEFENCES))
    assert "honest on what the filters pass" not in {p.name for p in everything}  # they pass everything
    assert all(p.tpr <= 0.5 for p in everything)  # no signal finds more challenges than chance
