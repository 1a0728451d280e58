"""Verification-epoch fault scenarios (see the package docstring for the contract): a committee
of 4 real verifier nodes runs epochs over scripted model nodes (testkit/epochs.py),
and one party misbehaves:

- `leader-drop`, `leader-alter`, `leader-forge`, `leader-omit`: every member, when it leads,
  drops the honest node's reply (reports it missing), alters a token of it, forges a reply of
  its own with a receipt it signed itself, or leaves the node out of its plan. An altered,
  forged or omitting epoch must abort with the leader blamed; a dropping one must end with the
  leader's report disputed (the other members reached the node: it is left unscored, the rest
  of the epoch stands, verifier/epochs/machine.py). Either way the honest node's reputation must
  not move.
- `node-down`, `node-cheat`: after an honest first epoch, one model node stops answering, or
  answers with tokens the reference model finds implausible. The committee must give it
  credibility 0 (down: the other members' own probes confirm the leader's report) or a score
  below the abnormal threshold (cheat) in every epoch that probes it, until it is untrusted;
  the honest node stays at reputation 1.0.

How the table's columns read here: `requests_sent` = epochs that probed the faulty party,
`answered` = those the committee judged right, `lost` = those it judged wrong (a lie
accepted, a faulty node not penalised, the honest node's reputation lowered); `recover_s` =
seconds from the start of the fault until it is neutralised (the first abort blaming the
leader or dispute against it, or the node untrusted). The live version with vLLM, the overlay and real model-node
processes is tests/test_epochs_live.py (too slow for this table).
"""

from __future__ import annotations

import time
from pathlib import Path

from gentorrent.config import REPUTATION

EPOCH_MODES = ("leader-drop", "leader-alter", "leader-forge", "leader-omit", "node-down", "node-cheat")


def _rep(committee, ident) -> float:
    return committee.model(ident).reputation


async def epoch_faults(root: Path, mode: str, seed: int = 0, quick: bool = False) -> dict:
    from testkit.epochs import EpochCommittee, ScriptedModels
    from gentorrent.ledger.epoch_txs import Phase
    from testkit.leader_faults import LeaderFaults

    if mode not in EPOCH_MODES:
        raise ValueError(f"mode is one of {EPOCH_MODES}")
    epochs = 2 if quick else 4
    models = ScriptedModels()
    honest, other = models.add("honest"), models.add("honest")
    faults = LeaderFaults()
    committee = EpochCommittee(Path(root), chain_id=f"epoch-faults-{seed}")
    await committee.start(models, faults)
    judged_right = judged_wrong = 0
    recover_s = None
    trace: list[dict] = []
    try:
        await committee.register(honest, 9001)
        await committee.register(other, 9002)
        sec = await committee.wait_epochs(1)  # one honest epoch first
        closed = len(sec.history)
        target = honest if mode.startswith("leader") else other
        if mode.startswith("leader"):
            getattr(faults, mode.removeprefix("leader-")).add(honest.node_id_hex)
        else:
            models.set(other, mode.removeprefix("node-"))
        fault_at = time.monotonic()
        while closed < 1 + epochs:
            sec = await committee.wait_epochs(closed + 1)
            for h in sec.history[closed:]:
                scores = {s.node_id: s.score_micros / 1e6 for s in h.result}
                reps = {"honest": _rep(committee, honest), "other": _rep(committee, other)}
                trace.append({"epoch": h.epoch, "phase": h.phase, "faulty_leader": h.faulty_leader,
                              "reason": h.reason[:80], "scores": {k.hex()[:8]: v for k, v in scores.items()},
                              "reputation": reps})
                disputed = "disputed" in h.reason
                probed = target.node_id in scores or h.phase == Phase.ABORTED or disputed  # (both name a reason)
                if not probed:
                    continue
                if mode == "leader-drop":
                    right = h.phase == Phase.DONE and disputed and target.node_id not in scores and reps["honest"] == 1.0
                elif mode.startswith("leader"):
                    right = h.phase == Phase.ABORTED and h.faulty_leader and reps["honest"] == 1.0
                else:
                    penalised = scores.get(target.node_id, 0.0) < REPUTATION.abnormal_threshold
                    right = h.phase == Phase.DONE and penalised and reps["honest"] == 1.0
                judged_right += right
                judged_wrong += not right
                neutralised = (h.faulty_leader or disputed if mode.startswith("leader")
                               else not committee.model(target).trusted)
                if recover_s is None and right and neutralised:
                    recover_s = time.monotonic() - fault_at
            closed = len(sec.history)
        faults_charged = sum(m.faults + m.disputes for m in sec.members)  # (a dropping leader: disputes)
        final = {"honest": _rep(committee, honest), "target": _rep(committee, target),
                 "target_trusted": committee.model(target).trusted}
    finally:
        await committee.stop()
    return {"requests_sent": judged_right + judged_wrong, "answered": judged_right, "lost": judged_wrong,
            "failed_clearly": None, "committed_txs_lost": None, "forks": None, "recover_s": recover_s,
            "note": f"{mode}: {judged_right} of {judged_right + judged_wrong} epochs judged right; honest reputation "
                    f"{final['honest']:.2f}; " + (f"leader faults charged {faults_charged}" if mode.startswith("leader")
                                                  else f"faulty node reputation {final['target']:.2f}, "
                                                       f"{'still trusted' if final['target_trusted'] else 'untrusted'}"),
            "extra": {"trace": trace, "final": final, "leader_faults_charged": faults_charged}}
