"""The devnet flow of `make demo` (up, ask, verification, status page, down), and config typos.

The devnet test starts real processes: 4 `gt-verifier`, 2 honest and 2 dishonest `gt-model
serve` (real vLLM engines on CPU: their start-up dominates the run time) and the minimum of
user nodes (n = 4 paths need that many relays), every model and user node registering itself
with the committee (nothing shared but the genesis); it asks, has the model group forward one
request between the two honest nodes (the model nodes claim the same model, so they form one
group; a dishonest one may leave it as soon as an epoch untrusts it, which is right, so it
is not used for the forward), watches the cheaters become untrusted, then checks that `down`
leaves nothing running. The demo runs 12 users and a pruned cheater (which
tests/test_epochs_live.py also catches); the test runs fewer users, and the two cheaters
challenges alone do not catch: a replayer (the same reply to every prompt: it scores as honest
text) and a selective cheater that answers honestly whatever it takes for a challenge — here
every challenge, since the devnet publishes its challenges' reply cap
(`--challenge-max-tokens`) — and garbage to everything else. The committee and the users run
audits at rate 1 (`--audit-rate 1`), and users keep asking while the epochs run: the selective
cheater falls to the audits of its real replies.

GT_DEVNET_CHEATERS (comma-separated testkit/cheaters.py kinds, default
`replay,selective`) swaps the two cheaters for others: `GT_DEVNET_CHEATERS=noisy,other-model`
runs the two kinds `make test` runs live nowhere else (Gemma's engine needs ~4.4 GiB more, and
two more engines cost minutes), with the same users asking and the same audits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from devnet import demo
from devnet import network as devnet
from gentorrent.config import CLOVES, DEVNET, REPUTATION, ROUTING

ROOT = Path(__file__).resolve().parents[1]
CHEATERS = tuple(k.strip() for k in os.environ.get("GT_DEVNET_CHEATERS", "replay,selective").split(","))


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


class _UsersAsking:
    """Users ask, one question every few seconds, while the epochs run: each user node audits
    its asks (rate 1 in this devnet), so a node that serves real asks badly is scored on them.
    Half the asks go through the users' own choice of node, half are sent to the selective
    cheater, the one that only audits catch (the group may still forward them: who served is
    what counts). Users sample at temperature 0.7, as clients do, so the audits of the replayer's
    real replies meet each member's memory of its outputs, as its challenges do
    (verifier/epochs/repeats.py). An epoch needs two audited garbage replies of a node to count
    them (audits.condemning_count), and an epoch here lasts 40-80 s (5 s of pause, one shared
    scoring pass per reply)."""

    def __init__(self, root: Path, audited: devnet.NodeInfo, interval_s: float = 2.0) -> None:
        import threading

        self.root, self.audited, self.interval_s = root, audited, interval_s
        self.served_by: dict[str, int] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "_UsersAsking":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop asking; an ask still in flight may finish on its own (the thread is a daemon,
        and the test's next steps do not depend on it): waiting for it cost minutes."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.interval_s):
            question = f"Question {i}: name {['a colour', 'a fruit', 'a city', 'an animal'][i % 4]} and say why."
            try:
                if i % 2:
                    answer = devnet.ask_node(question, self.audited, self.root, user=i % CLOVES.n, max_tokens=16,
                                             timeout=60, temperature=0.7)
                else:
                    answer = devnet.ask(question, self.root, user=i % CLOVES.n, max_tokens=16, timeout=60,
                                        temperature=0.7)
                self.served_by[answer["served_by"]] = self.served_by.get(answer["served_by"], 0) + 1
            except Exception as exc:  # an untrusted node refusing, a timeout: the next ask goes on
                self.errors.append(str(exc)[:200])
            i += 1


# --------------------------------------------------------------------------- config typos


def test_model_node_config_typo_is_a_clear_error_naming_the_key(tmp_path):
    (tmp_path / "config.toml").write_text("[model_node]\ncpu_kv_cache_gb = 2\n")
    out = _cli("model_node.cli", "serve", "--home", str(tmp_path), "--listen", "127.0.0.1:0")
    assert out.returncode == 2
    assert "model_node.cpu_kv_cache_gb: unknown key" in out.stderr
    assert "did you mean 'cpu_kv_cache_gib'" in out.stderr
    assert not (tmp_path / "node.json").exists()  # nothing started


def test_model_node_config_unknown_section_is_a_clear_error(tmp_path):
    (tmp_path / "config.toml").write_text("[routng]\ngossip_interval_s = 5.0\n")
    out = _cli("model_node.cli", "serve", "--home", str(tmp_path), "--listen", "127.0.0.1:0")
    assert out.returncode == 2
    assert "unknown section [routng]" in out.stderr and "'routing'" in out.stderr


def test_user_node_config_typo_is_a_clear_error_naming_the_key(tmp_path):
    (tmp_path / "config.toml").write_text("[overlay]\nmaintenance_interval_sec = 3.0\n")
    (tmp_path / "directory.json").write_text("{}")
    out = _cli("user_client.cli", "start", "--home", str(tmp_path), "--directory", str(tmp_path / "directory.json"))
    assert out.returncode == 2
    assert "overlay.maintenance_interval_sec: unknown key (did you mean 'maintenance_interval_s'?)" in out.stderr
    assert not (tmp_path / "node.json").exists()


# --------------------------------------------------------------------------- devnet commands


def test_status_and_ask_without_a_devnet_say_so(tmp_path):
    for args in (("status",), ("ask", "hi")):
        out = _cli("devnet.network", "--root", str(tmp_path / "none"), *args)
        assert out.returncode == 3  # no devnet there (README "Exit statuses")
        assert "no devnet at" in out.stderr and "gt-devnet up" in out.stderr


def test_dishonest_kinds_are_given_out_in_turn_and_an_unknown_one_is_refused(tmp_path):
    shape = replace(DEVNET, honest_models=1, dishonest_models=3, dishonest_variant="replay, selective")
    assert devnet._engine_plan(shape, reference=True) == [
        (devnet.REFERENCE, None), ("honest0", None), ("dishonest0", "replay"), ("dishonest1", "selective"),
        ("dishonest2", "replay")]
    out = _cli("devnet.network", "--root", str(tmp_path), "up", "--dishonest-kind", "pruned,lazy")
    assert out.returncode == 2 and "unknown dishonest kind 'lazy'" in out.stderr  # a bad argument
    assert not list(tmp_path.iterdir())  # refused before anything started
    out = _cli("devnet.network", "--root", str(tmp_path), "up", "--audit-rate", "1.5")
    assert out.returncode == 2 and "--audit-rate" in out.stderr
    out = _cli("devnet.network", "--root", str(tmp_path), "up", "--echo", "--dishonest", "1")
    assert out.returncode == 1 and "--echo needs --dishonest 0" in out.stderr
    out = _cli("devnet.network", "--root", str(tmp_path), "up", "--wan", "moon")
    assert out.returncode == 2 and "invalid choice: 'moon'" in out.stderr
    assert not list(tmp_path.iterdir())


def test_down_without_a_devnet_stops_nothing(tmp_path):
    out = _cli("devnet.network", "--root", str(tmp_path), "down")
    assert out.returncode == 0 and "stopped 0 processes" in out.stdout


@pytest.mark.engine
@pytest.mark.network
@pytest.mark.timeout(1500)
def test_devnet_up_ask_verify_dashboard_down(tmp_path, model_node):
    root = tmp_path / "devnet"
    # challenges capped at 64 tokens (the demo's 96): every member scores every reply on one shared
    # CPU engine, and the epochs this test waits for are what its run time is made of
    shape = replace(DEVNET, honest_models=2, dishonest_models=len(CHEATERS), dishonest_variant=",".join(CHEATERS),
                    audit_rate=1.0, users=CLOVES.n + 1, challenge_max_tokens=64)
    t0 = time.monotonic()
    notes: list[str] = []  # what `up` said, with when (printed at the end: where the time went)

    def note(line: str) -> None:
        notes.append(f"{time.monotonic() - t0:6.0f} s  {line}")

    try:
        # the session's honest model node doubles as the verifiers' reference engine
        state = devnet.up(root, shape, progress=note,
                          reference_at=(model_node.address, model_node.info["cert_file"]))
        assert devnet.running(root), "up returned but nothing runs"
        assert len(state.of_role("verifier")) == DEVNET.verifiers
        models = state.of_role("model")
        assert [m.extra["cheat"] for m in models] == ["", "", *CHEATERS]
        # users send half their asks to the selective cheater (only audits catch it), else the last one
        audited = models[2 + CHEATERS.index("selective") if "selective" in CHEATERS else -1]

        # the anonymous ask: served by a registered model node, over n paths of l relays
        answer = devnet.ask("Name one primary colour.", root, user=0, max_tokens=16)
        assert answer["text"].strip()
        assert answer["served_by"] in {m.node_id for m in models}
        assert len(answer["route"]) >= CLOVES.k
        relays = {u.name for u in state.of_role("user")} | {f"{v.name}-probe" for v in state.of_role("verifier")}
        assert all(hop in relays for path in answer["route"] for hop in path)
        assert "u00" not in {hop for path in answer["route"] for hop in path[-1:]}  # not its own proxy

        # one request the model group forwarded: sent to the second node, whose Hash-Radix tree
        # matched the prefix the first one served (both registered themselves; forwarding is on)
        forwarded = demo.show_forwarding(state, root, pair=(models[0], models[1]))
        assert forwarded is not None, "no request was forwarded"
        # the prefix's holder is whichever served its first ask (a new prefix goes to its rendezvous home)
        assert {forwarded["sent_to"], forwarded["served_by"]} == {m.node_id for m in models[:2]}
        assert forwarded["forward"]["depth"] >= ROUTING.match_depth_threshold
        assert not list(root.rglob("directory.json"))  # nothing shared but the genesis

        # status: every node up; the committee's certified directory lists every node
        report = devnet.status(root)
        assert all(row["running"] for row in report["nodes"])
        assert report["committee_directory"]["models"] == len(models)
        # a model is its weights: both honest nodes registered the one digest of SmolLM2's weights
        digests = {json.loads((Path(m.home) / "node.json").read_text())["weights_digest"] for m in models[:2]}
        assert len(digests) == 1 and digests.pop().startswith("sha256:")
        assert report["committee_directory"]["users"] >= shape.users  # (+ verifiers' probing users)

        # Prometheus text on every node
        for node in state.nodes:
            with urllib.request.urlopen(node.extra["metrics"], timeout=10) as r:
                text = r.read().decode()
            assert {"verifier": "gentorrent_consensus_height", "model": "gentorrent_requests_running",
                    devnet.REFERENCE: "gentorrent_requests_running", "user": "gentorrent_cloves_relayed"}[node.role] in text
            if node.role == "model":  # vLLM's request families, on every node that served
                assert "gentorrent_time_to_first_token_seconds_bucket" in text

        # the verifiers' status page shows the live network (rendered by headless Chromium)
        from testkit.browser import dump_dom

        dom = dump_dom(state.of_role("verifier")[0].extra["dashboard"])
        assert dom.count('class="model"') == len(models)
        assert all(m.node_id[:16] in dom for m in models)
        users_shown = re.search(r'id="users">user nodes<b>(\d+)</b>', dom)
        assert users_shown and int(users_shown.group(1)) >= shape.users

        # verification: the dishonest node becomes untrusted, when this build runs epochs
        table = demo.reputation_table(state)
        assert {r["name"] for r in table} == {m.name for m in models}
        note("asked, forwarded, status, metrics and dashboard checked")
        if demo.epochs_running(state):
            with _UsersAsking(root, audited) as asking:  # real traffic for the audits to sample
                untrusted_at = demo.run_verification(state, timeout_s=900)
            note(f"verification: cheaters untrusted after {untrusted_at} epochs")
            assert untrusted_at, "a dishonest node was not untrusted"
            # the paper's goal, counted from each cheater's registration (epochs that opened after it)
            assert max(untrusted_at.values()) <= REPUTATION.goal_epochs, untrusted_at
            assert all(r["trusted"] for r in demo.reputation_table(state) if not r["dishonest"])
            # the selective cheater answered real asks itself (garbage), and the users audited them
            assert asking.served_by.get(audited.node_id, 0) >= 1, asking.served_by
            audits = [devnet.user_status(u)["audits"] for u in state.of_role("user")]
            assert sum(a.get("handed_in", 0) for a in audits) >= 1, audits
            for kind, node in zip(CHEATERS, models[2:]):
                replays = sum(line.startswith(f"audit of {node.node_id[:16]}") and "output replayed" in line
                              for log in (root / "logs").glob("verifier-*.log")
                              for line in (entry.partition(" INFO ")[2] for entry in log.read_text().splitlines()))
                print(f"the {kind} cheater served {asking.served_by.get(node.node_id, 0)} real asks; the members "
                      f"zeroed {replays} audits of them as replays")
            # and it leaves the users' routing: the next ask is served by the honest node
            assert demo.ask_after_verdict(state, root, "Say hello.")["served_by"] in {m.node_id for m in models[:2]}
        else:
            warnings.warn("this build's gt-verifier runs no verification epochs: "
                          "the 'dishonest node becomes untrusted' step was not tested")
    finally:
        stopped = devnet.down(root)
        note(f"down: {len(stopped)} processes stopped")
        print("\n".join(notes))
    engines = len(state.of_role("model")) + len(state.of_role(devnet.REFERENCE))
    assert len(stopped) == DEVNET.verifiers + engines + shape.users
    assert devnet.running(root) == []
