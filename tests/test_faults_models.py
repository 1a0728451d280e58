"""Model-node faults on real processes (two `python -m testkit.echo_model`
processes serving one model; in-process user nodes relay and ask): the node listed first is
killed mid-stream, paused, answers garbage, answers with a broken receipt signature, or
refuses as busy. Every ask ends with the right answer from the healthy node or a clear error;
nothing from a lying node is ever accepted. Scenario code shared with bench/reliability.py.

The unit tests at the end pin the user client's answers to these faults (asking.Asker):
a node that failed is tried last for a while, and a node no path could reach costs the user
its attempt, not its paths.
"""

from __future__ import annotations

import pytest

from gentorrent.config import OverlayParams
from testkit import scenarios
from user_client.asking import UNDECODABLE_REPLY, Asker
from gentorrent.ledger.sections import ModelRecord

#: the reason the user gives up on the victim, per fault (attempt["reason"]: attempt["detail"])
VICTIM_FAILS_WITH = {"kill-mid-stream": "no_answer", "hang": "no_answer", "garbage": f"bad_reply: model node error: "
                     f"{UNDECODABLE_REPLY}", "bad-signature": "bad_signature", "refuse": "busy"}


@pytest.mark.network
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", scenarios.MODEL_MODES)
async def test_a_faulty_model_node_costs_the_user_no_answer(tmp_path, mode):
    out = await scenarios.model_faults(tmp_path, mode, seed=5, quick=True)
    extra = out["extra"]
    assert out["lost"] == 0 and extra["victim_accepted"] == 0, out
    assert extra["victim_tried_in_asks"] >= 2, out  # the fault was really met (by `me`, then `other`)
    failures = extra["victim_failures"]
    assert failures and all(f.startswith(VICTIM_FAILS_WITH[mode]) for f in failures), out
    assert out["recover_s"] is not None, out
    leaks = extra["model_log_key_leaks"]
    assert leaks["hits"] == [] and leaks["logs"] == 2 and leaks["log_bytes"] > 0 and leaks["needles"] >= 6, out
    if mode == "hang":
        # a streamed ask cannot switch nodes once text was shown: a clear error, not a hang
        probe = extra["streamed_ask_paused_mid_stream"]
        assert probe["outcome"].startswith("clear error") and probe["deltas_before_error"] >= 1, out
        assert out["failed_clearly"] == 1 and extra["answered_after_resume"], out
        assert out["answered"] == out["requests_sent"] - 1, out
    else:  # a buffered ask moves on to the healthy node, whatever the victim did
        assert out["answered"] == out["requests_sent"], out
    # whatever the node did, it is the node's fault: no path was thrown away for it
    assert extra["paths_failed"] == 0, out  # the node's fault is not the paths' (each ask builds its own anyway)
    if mode in ("kill-mid-stream", "hang"):  # `other` met a node that no path reaches
        assert any("model node unreachable" in f for f in extra["victim_failures"]), out
    # `me` learned: after its first failed attempt on the victim, the victim was tried last
    assert extra["victim_tried_in_asks"] <= 2 + (mode == "hang"), out


# ----------------------------------------------------------------------------- asking units


class _Models:
    def __init__(self, records):
        self.records = records

    def models(self):
        return list(self.records)


def _record(name: str, reputation: float) -> ModelRecord:
    return ModelRecord(node_id=name.encode() * 32, public_key=b"k" * 32, address=f"127.0.0.1:{len(name)}",
                       model="m", onion_key=b"o" * 32, reputation=reputation)


def _asker(records, now):
    params = OverlayParams(failed_model_last_s=60.0)
    return Asker(_Models(records), paths=None, params=params, clock=lambda: now[0])


def test_a_model_node_that_failed_is_tried_last_until_its_time_is_up():
    now = [100.0]
    liar, honest = _record("a", 2.0), _record("b", 1.0)
    asker = _asker([liar, honest], now)
    asker.affinity["s"] = liar.node_id_hex
    assert [m.node_id_hex for m in asker.candidates("m", "s", None)] == [liar.node_id_hex, honest.node_id_hex]
    asker._note_failure(liar.node_id_hex)
    assert [m.node_id_hex for m in asker.candidates("m", "s", None)] == [honest.node_id_hex, liar.node_id_hex]
    assert [m.node_id_hex for m in asker.candidates("m", None, liar.node_id_hex)] == [liar.node_id_hex]  # asked by name
    now[0] += 61.0
    assert asker.candidates("m", None, None)[0].node_id_hex == liar.node_id_hex


class _Path:
    def __init__(self, path_id: int) -> None:
        self.path_id = path_id


def test_an_unreachable_node_is_blamed_once_then_the_paths_are():
    asker = _asker([], [0.0])
    first = [_Path(1), _Path(2), _Path(3)]
    assert asker._blame_node(first)  # node A unreachable over paths 1-3: keep the paths
    assert asker._blame_node([_Path(4), _Path(5)])  # node B over other paths: the same
    assert not asker._blame_node([_Path(2), _Path(6)])  # path 2 fails again, for another node: the paths
    assert asker._blame_node([_Path(2)])  # suspicion was spent on that judgement


def test_a_forwarded_reply_is_accepted_only_from_a_trusted_member_of_the_same_model():
    """The node asked may forward to a group peer, which signs and names itself: the asker takes
    that peer's registered key, and nobody else's (an unknown, untrusted or other-model signer)."""
    from types import SimpleNamespace

    from gentorrent.wire import gentorrent_pb2 as pb

    def record(i: int, model: str = "m", trusted: bool = True) -> ModelRecord:
        return ModelRecord(bytes([i]) * 32, bytes([i]) * 32, f"127.0.0.1:{9000 + i}", model, b"\0" * 32,
                           trusted=trusted)

    asked, peer, untrusted, other = record(1), record(2), record(3, trusted=False), record(4, model="x")
    me = SimpleNamespace(directory=SimpleNamespace(models=lambda: [asked, peer, untrusted, other]))
    server_of = Asker._server_of
    assert server_of(me, pb.ReplyReceipt(node_id=asked.node_id), asked) is asked
    assert server_of(me, pb.ReplyReceipt(node_id=peer.node_id), asked) is peer
    for signer in (untrusted, other, record(5)):
        assert server_of(me, pb.ReplyReceipt(node_id=signer.node_id), asked) is None
