"""The process supervisor stops what it started, and only that."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from devnet import supervisor
from devnet.supervisor import Supervisor, stop_recorded, wait_until


@pytest.mark.network  # processes in the background
def test_stop_recorded_stops_own_processes_and_spares_others(tmp_path):
    sup = Supervisor(tmp_path)
    sup.spawn("sleeper", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_until(lambda: b"up" in (tmp_path / "logs" / "sleeper.log").read_bytes(), 10, "sleeper output")
        stopped = stop_recorded(tmp_path, grace_s=5)   # as `down` from another shell would
        assert stopped == ["sleeper"]
        wait_until(lambda: not sup.alive("sleeper"), 5, "sleeper exit")
        assert bystander.poll() is None
        assert stop_recorded(tmp_path) == []
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.network
def test_killed_node_is_reported_dead(tmp_path):
    sup = Supervisor(tmp_path)
    sup.spawn("victim", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert sup.alive("victim")
    sup.kill("victim")
    assert not sup.alive("victim") and sup.exit_code("victim") == -9
    sup.stop_all(grace_s=1)


def test_port_blocks_are_drawn_outside_the_kernels_ephemeral_range(monkeypatch):
    """A block chosen now and bound minutes later must not be handed meanwhile to a listener on
    port 0 or to an outgoing connection (a demo's verifier once failed to bind its port)."""
    low, high = supervisor.ephemeral_ports()
    bases = [supervisor.free_port_block(4) for _ in range(30)]
    assert all(not (low <= b + i <= high) for b in bases for i in range(4)), (low, high, bases)
    monkeypatch.setattr(supervisor, "ephemeral_ports", lambda: (1024, 60999))  # no room below: above
    assert all(supervisor.free_port_block(2) > 60999 for _ in range(10))


@pytest.mark.network
def test_a_process_of_a_nodes_group_that_ignores_sigterm_is_stopped_too(tmp_path):
    """The node exits on SIGTERM; a process it started ignores SIGTERM (as multiprocessing's
    resource tracker, which vLLM starts, does: CI saw four outlive a devnet's `down`). It used to
    be left running, since only a node still alive after the grace got SIGKILL."""
    sup = Supervisor(tmp_path)
    child = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "print('child up', flush=True); time.sleep(120)")
    parent = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              "print('child', c.pid, flush=True); time.sleep(120)")
    sup.spawn("parent", [sys.executable, "-c", parent])
    log = tmp_path / "logs" / "parent.log"
    wait_until(lambda: b"child up" in log.read_bytes(), 20, "the child's start")
    child_pid = int(re.search(r"child (\d+)", log.read_text()).group(1))
    assert supervisor._start_time(child_pid) is not None
    assert stop_recorded(tmp_path, grace_s=5) == ["parent"]
    assert supervisor._start_time(child_pid) is None  # gone (or a zombie waiting for its reaper)
