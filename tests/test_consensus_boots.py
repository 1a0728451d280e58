"""The boot counter (verifier/consensus/boots.py): round-state sequence numbers that grow across
restarts whatever the clock does, from a counter that no crash leaves unreadable."""

from __future__ import annotations

import logging

from verifier.consensus import boots


def test_each_boot_starts_above_every_number_of_the_previous_one(tmp_path, monkeypatch):
    import time as _time
    seqs = []
    for k in range(4):  # the clock going back an hour at every boot changes nothing
        monkeypatch.setattr(_time, "time", lambda k=k: 1.7e9 - 3600 * k)
        seqs.append(boots.boot_state_seq(tmp_path))
    assert seqs == [boots.first_state_seq(b) for b in (1, 2, 3, 4)]
    assert all(later > earlier + 2**31 for earlier, later in zip(seqs, seqs[1:]))
    assert (tmp_path / boots.BOOT_FILE).read_text() == "4\n"
    assert not list(tmp_path.glob("*.new"))  # written whole, then renamed


def test_an_unreadable_counter_warns_and_goes_on_above_any_real_count(tmp_path, caplog):
    path = tmp_path / boots.BOOT_FILE
    path.write_text("\x00\x13garbage")
    with caplog.at_level(logging.WARNING, logger="verifier.consensus.boots"):
        boot = boots.next_boot(path)
    assert boot > 10**9 and "unreadable" in caplog.text
    assert boots.next_boot(path) == boot + 1  # and counts on from there
