"""The routing simulator's quick mode runs end to end and ranks HR-tree + LB above round robin."""

from __future__ import annotations

import csv

from sims import routing


def test_quick_mode_runs_and_ours_beats_round_robin(tmp_path, capsys):
    assert routing.main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ours vs RR" in out
    for name in ("routing_quick.md", "routing_quick.csv", "routing_quick_tooluse_8n.png",
                 "routing_quick_mixed_8n.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = list(csv.DictReader(open(tmp_path / "routing_quick.csv")))
    assert {r["policy"] for r in rows} == set(routing.POLICIES)
    by = {(r["workload"], r["rate"], r["policy"]): r for r in rows}
    for (workload, rate, policy), row in by.items():
        assert int(row["n"]) > 0
        if policy != "ours":
            continue
        rr = by[(workload, rate, "round_robin")]
        assert float(row["mean_s"]) < float(rr["mean_s"]), (workload, rate)
        assert float(row["hit_rate"]) > float(rr["hit_rate"]), (workload, rate)
        assert float(row["forward_rate"]) > 0 and float(row["tree_hit_rate"]) > 0
