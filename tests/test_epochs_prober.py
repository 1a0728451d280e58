"""The overlay prober: a member short of its own proxy paths waits for them, and does not
report the model node missing for its own shortage.

Seen in `make demo`: just after start-up, epoch 1's leader had built only 2 of the n = 4 paths
an ask needs, reported the node it challenged missing; the other members probed it 30-50 s
later, reached it, and the epoch aborted with the honest leader blamed."""

from __future__ import annotations

import pytest

from gentorrent.config import OverlayParams
from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import NO_PATHS, Answer, AskError
from verifier.epochs.overlay_prober import OverlayProber
from verifier.epochs.runner import ProbeFailed

NODE = "ab" * 32


class ShortOfPaths:
    """A user node whose first `short` asks find too few paths; then one answers."""

    def __init__(self, short: int, then: Exception | None = None) -> None:
        self.short, self.then, self.asks = short, then, 0
        self.params = OverlayParams(path_retry_s=0.01)

    async def ask_request(self, request: pb.GenerateRequest, node_id: str | None = None) -> Answer:
        self.asks += 1
        if self.asks <= self.short:
            raise AskError("this user node holds only 2 usable proxy paths, an ask needs 4", code=NO_PATHS)
        if self.then is not None:
            raise self.then
        receipt = pb.ReplyReceipt(model=request.model)
        return Answer("hi", [1, 2], node_id, request.model, "stop", receipt, request, [], [])


async def test_a_member_short_of_paths_waits_for_them_instead_of_reporting_the_node_missing():
    user = ShortOfPaths(short=3)
    answer = await OverlayProber(user, patience_s=5.0).ask(pb.GenerateRequest(model="m"), NODE)
    assert answer.token_ids == [1, 2] and user.asks == 4


async def test_a_member_still_short_of_paths_after_its_patience_reports_why():
    user = ShortOfPaths(short=10**6)
    with pytest.raises(ProbeFailed, match="usable proxy paths"):
        await OverlayProber(user, patience_s=0.1).ask(pb.GenerateRequest(model="m"), NODE)
    assert 1 < user.asks < 10**6


async def test_a_node_that_does_not_answer_is_reported_at_once():
    user = ShortOfPaths(short=0, then=AskError("no model node answered", code="no_model_node_answered"))
    with pytest.raises(ProbeFailed, match="no model node answered"):
        await OverlayProber(user, patience_s=5.0).ask(pb.GenerateRequest(model="m"), NODE)
    assert user.asks == 1


def test_a_probe_waits_longer_than_a_user_for_a_first_reply_instead_of_asking_again():
    """A slow honest node gets `probe_reply_wait_s` (a node cannot see how long an asker waits);
    a second ask of the same node would tell it the request was a probe (no user re-sends one
    ask to one node), so there is none (the test above: one ask)."""
    from dataclasses import replace

    from gentorrent.config import EPOCH_RUN, OVERLAY, EpochRunParams
    from verifier.epochs.wiring import probe_user_params

    probing = probe_user_params(EPOCH_RUN, OVERLAY)
    assert probing.first_reply_timeout_s == EPOCH_RUN.probe_reply_wait_s > OVERLAY.first_reply_timeout_s
    assert replace(probing, first_reply_timeout_s=OVERLAY.first_reply_timeout_s) == OVERLAY  # else a user's
    patient = replace(OVERLAY, first_reply_timeout_s=300.0)
    assert probe_user_params(EPOCH_RUN, patient) == patient
    with pytest.raises(ValueError, match="probe_reply_wait_s"):
        EpochRunParams(probe_reply_wait_s=0)
