"""Replies by content, not by clock (gentorrent/overlay/reply_pacing.py): the pure pacer in
virtual time. The end-to-end count of reply messages is in tests/test_overlay_network.py."""

from __future__ import annotations

import random

import pytest

from gentorrent.overlay.reply_pacing import ReplyPacer, merge_chunks
from gentorrent.wire import gentorrent_pb2 as pb

W = 0.25


def _token(i: int, final: bool = False) -> pb.GenerateChunk:
    return pb.GenerateChunk(text=f"t{i} ", token_ids=[i], final=final)


def _run(arrivals: list[float], window: float = W) -> list[tuple[float, pb.GenerateChunk]]:
    """Feed tokens arriving at `arrivals` (the last one final); release every message when due,
    as the intake does (it wakes at due_at, or when a chunk arrives)."""
    pacer = ReplyPacer(window)
    out: list[tuple[float, pb.GenerateChunk]] = []
    events = sorted((t, i) for i, t in enumerate(arrivals))
    i = 0
    now = 0.0
    while not pacer.finished:
        due = pacer.due_at()
        next_arrival = events[i][0] if i < len(events) else None
        if due is not None and (next_arrival is None or due <= next_arrival):
            now = max(now, due)
            chunk = pacer.take(now)
            assert chunk is not None
            out.append((now, chunk))
            continue
        now = next_arrival
        pacer.add(_token(events[i][1], final=events[i][1] == len(arrivals) - 1), now)
        i += 1
    return out


def test_the_first_token_and_the_last_leave_at_once_the_rest_on_the_grid():
    out = _run([1.0, 1.01, 1.02, 1.30, 1.31, 2.0])
    times = [t for t, _ in out]
    assert times[0] == 1.0  # the first at once
    assert times[1] == pytest.approx(1.25) and times[2] == pytest.approx(1.5)  # grid points of the first message
    assert times[-1] == 2.0 and out[-1][1].final  # the last at once
    assert [list(c.token_ids) for _, c in out] == [[0], [1, 2], [3, 4], [5]]


def test_a_pause_sends_nothing_never_an_empty_message():
    # two tokens, then 3 s of silence, then the end: the old cadence sent ~60 empty messages
    out = _run([0.0, 0.1, 3.1])
    assert len(out) == 3 and all(c.token_ids for _, c in out)
    assert out[1][0] == pytest.approx(0.25) and out[2][0] == 3.1


def test_a_token_after_a_pause_waits_for_the_grid_not_for_its_own_arrival():
    # the release time says which window a token came in, not when in it
    a = _run([0.0, 1.01, 5.0])
    b = _run([0.0, 1.24, 5.0])
    assert a[1][0] == b[1][0] == pytest.approx(1.25)


@pytest.mark.parametrize("seed", range(20))
def test_random_streams_every_token_within_a_window_and_at_most_duration_over_window_messages(seed):
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(rng.randrange(1, 400)):
        t += rng.choice([rng.expovariate(50), rng.expovariate(2), 0.0])
        arrivals.append(t)
    out = _run(arrivals)
    released = {}
    for at, chunk in out:
        assert chunk.token_ids, "an empty reply message"
        for token in chunk.token_ids:
            released[token] = at
    assert sorted(released) == list(range(len(arrivals)))  # every token, once, in order below
    assert [tok for _, c in out for tok in c.token_ids] == list(range(len(arrivals)))
    assert max(released[i] - arrivals[i] for i in range(len(arrivals))) <= W + 1e-9
    duration = arrivals[-1] - arrivals[0]
    assert len(out) <= duration / W + 2
    non_final = [at for at, c in out[:-1]]
    assert all(b - a >= W - 1e-9 for a, b in zip(non_final[1:], non_final[2:]))


def test_an_engine_that_stops_without_a_final_chunk_ends_the_answer_with_an_error():
    pacer = ReplyPacer(W)
    pacer.add(_token(0), 0.0)
    assert pacer.take(0.0).token_ids == [0]
    pacer.add(_token(1), 0.1)
    pacer.end("engine died", 0.2)
    chunk = pacer.take(0.2)  # at once: the end does not wait for the grid
    assert chunk.final and chunk.error == "engine died" and list(chunk.token_ids) == [1]
    assert pacer.finished and pacer.due_at() is None
    pacer.end("again", 0.3)  # after the end nothing more leaves
    assert pacer.take(1.0) is None
    with pytest.raises(ValueError):
        pacer.add(_token(2), 1.0)


def test_nothing_is_due_before_its_time_and_the_window_must_be_positive():
    pacer = ReplyPacer(W)
    assert pacer.due_at() is None and pacer.take(5.0) is None
    pacer.add(_token(0), 1.0)
    assert pacer.take(1.0) is not None
    pacer.add(_token(1), 1.1)
    assert pacer.take(1.2) is None and pacer.due_at() == pytest.approx(1.25)
    with pytest.raises(ValueError):
        ReplyPacer(0)


def test_merging_keeps_order_and_takes_the_end_from_the_last():
    last = pb.GenerateChunk(text="c", token_ids=[3], final=True, finish_reason="stop", served_by="n")
    last.receipt.node_id = b"x"
    merged = merge_chunks([_token(1), _token(2), last])
    assert merged.text == "t1 t2 c" and list(merged.token_ids) == [1, 2, 3]
    assert merged.final and merged.finish_reason == "stop" and merged.receipt.node_id == b"x"
