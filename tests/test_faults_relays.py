"""Relay faults on a real overlay, scenario code shared with bench/reliability.py.

In-process (14 user nodes relaying over pinned TLS on 127.0.0.1, the echo model node with the
real clove intake): one relay (first or second hop) of n - k = 2 of the n = 4 paths is killed,
hangs, drops, corrupts or replays the cloves it forwards. Every ask is still answered; killed
relays leave the repaired path pool; corruptions and replays are dropped with a counted reason.

Real processes (8 `gt-user start` relays, the echo model process): kill -9, SIGSTOP/SIGCONT,
and drop / delay / blackhole on the links into relays through the fault proxy; plus the
regressions those scenarios found, and the key-leak scan they end with."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from testkit import scenarios

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]


@pytest.mark.parametrize("mode", scenarios.RELAY_MODES)
async def test_asks_survive_n_minus_k_faulty_relays(tmp_path, mode):
    out = await scenarios.relay_faults(tmp_path, mode, seed=11, quick=True)
    extra = out["extra"]
    assert extra["victims"] == scenarios.RELAY_CLOVES_N - scenarios.RELAY_CLOVES_K, out
    assert out["answered"] == out["requests_sent"], out
    assert extra["paths_repaired"], out
    if mode != "kill":
        # the fault really hit (a path whose relay times out is replaced, so maybe only once)
        assert extra["fault_hits"].get(mode, 0) >= extra["victims"], out
    if mode in ("kill", "hang", "corrupt", "drop"):  # a failed send marks the path failed: it is replaced
        assert extra["paths_failed"] >= 1 and extra["paths_rebuilt"] >= 1, out
    if mode == "drop":  # the model node never lists the dropped cloves as delivered in its reply
        assert extra["asker_drops"].get("unproven_delivery", 0) >= 1, out
    if mode == "corrupt":  # the next relay cannot open the layer: counted, skipped
        assert extra["relay_drops"].get("bad_layer", 0) >= 1, out
    if mode == "replay":
        assert extra["fault_hits"]["replay_refused"] == extra["fault_hits"]["replay"], out
        assert extra["relay_drops"].get("replay", 0) >= extra["fault_hits"]["replay"], out


# ------------------------------------------------------------------ real relay processes


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.xfail(strict=False, reason=(
    "KNOWN WEAKNESS (THREAT_MODEL.md, the anonymous path): with hop-local acks a relay whose outgoing link "
    "silently loses cloves is found only when an ask settles, so a path may be reused or rebuilt through it, "
    "and the first ask through a relay whose link was dropped and healed may get no reply; failed 3 of 4 "
    "full runs after the overlay merge, on different checks"))) if m == "link" else m
    for m in scenarios.RELAY_PROCESS_MODES])
async def test_asks_survive_killed_paused_or_cut_off_relay_processes(tmp_path, mode):
    """8 `gt-user start` relay processes and the echo model process; relays on n - k = 2 of
    the asker's 4 paths are kill -9'd, SIGSTOPped then SIGCONTed, or cut off by their fault
    proxy (drop, delay, blackhole, each healed). Every ask is answered, failed paths are
    rebuilt around the fault, a resumed or healed relay carries a path again, no ask is left
    pending, and no process wrote any of the processes' private keys to its log."""
    out = await scenarios.relay_process_faults(tmp_path, mode, seed=11, quick=True)
    extra = out["extra"]
    leaks = extra["secrets_in_logs"]
    assert leaks["hits"] == [], leaks
    assert leaks["logs"] == scenarios.RELAY_PROCESSES + 1 and leaks["log_bytes"] > 0, leaks
    assert out["requests_sent"] > 0 and out["answered"] == out["requests_sent"], out
    assert out["lost"] == 0 and out["recover_s"] is not None, out
    assert extra["asker_pending_after"] == 0, extra
    budget = scenarios.RELAY_CLOVES_N - scenarios.RELAY_CLOVES_K
    for phase in extra["phases"]:
        assert phase["paths_hit"] == budget and phase["victims"], phase
        assert sum(1 for relays in phase["pool"] if set(relays) & set(phase["victims"])) == budget, phase
        assert phase["repair"]["repaired"], phase
        if phase["phase"] != "link-delay":  # a delayed path still works: nothing fails
            assert phase["paths_failed"] >= 1, phase
        for name, probe in phase.get("probes", {}).items():
            assert probe["health"] and probe["established"] and probe["replied"], (name, phase)
    phases = {p["phase"]: p for p in extra["phases"]}
    if mode == "pause":
        assert all(phases["pause"]["own_api_ask"].values()), phases["pause"]
    if mode == "link":
        assert set(phases) == {f"link-{k}" for k in scenarios.LINK_PHASES}
        assert phases["link-drop"]["proxy"]["refused"] + phases["link-drop"]["proxy"]["reset"] > 0, phases
        assert phases["link-blackhole"]["proxy"]["blackholed_bytes"] > 0, phases
        assert phases["link-delay"]["proxy"]["forwarded_bytes"] > 0, phases  # delayed, not lost


@pytest.mark.timeout(60)
async def test_a_hung_later_hop_is_suspected_not_only_the_first_hop(tmp_path):
    """Regression: an establishment that ran into its deadline used to blame only the first
    hop (+2: excluded at once) although a later hop hung, so repairs kept choosing the paused
    relay and excluded its innocent neighbours. Now every hop is suspected once."""
    from testkit.localnet import start_user_nodes

    cloves, params = scenarios.scenario_params()
    params = dataclasses.replace(params, establish_timeout_s=1.0)
    nodes = await start_user_nodes(4, tmp_path / "directory.json", tmp_path, cloves=cloves, params=params,
                                   maintain=False)
    me, first, hung, last = nodes
    try:
        original = hung.relay.on_establish

        async def hanging(link, request):  # a paused relay, as its neighbours see it
            await asyncio.sleep(3.0)
            return await original(link, request)

        hung.relay.on_establish = hanging
        assert await me.paths.establish_through([first.record, hung.record, last.record]) is None
        suspects = me.paths.status()["suspects"]
        assert suspects.get(hung.address, 0) >= 1, suspects
        assert suspects.get(first.address, 0) < 2, suspects  # not excluded for its successor's hang
        hung.relay.on_establish = original
        assert await me.paths.establish_through([first.record, last.record, hung.record]) is not None
        assert first.address not in me.paths.status()["suspects"]  # a good path clears its hops
    finally:
        for n in nodes:
            await n.stop()


def test_key_leak_scan_finds_every_encoding_of_every_key(tmp_path):
    import base64

    from gentorrent.crypto import tls
    from gentorrent.crypto.keys import NodeKeys
    from testkit.keyleaks import home_secrets, raw_private_bytes, scan_for_secrets

    keys = NodeKeys.load_or_create(tmp_path / "home")
    tls.TlsIdentity.load_or_create(tmp_path / "home", keys.identity)
    needles = home_secrets(tmp_path / "home", "r0")
    clean = tmp_path / "clean.log"
    clean.write_text("INFO relay started at 127.0.0.1:4000 node " + keys.identity.node_id_hex + "\n")
    assert scan_for_secrets([clean], needles) == []
    leaks = {
        "identity base64": base64.b64encode(keys.identity.seed()).decode(),
        "onion hex": raw_private_bytes((tmp_path / "home" / "onion.key.pem").read_bytes()).hex().upper(),
        "tls pem line 1": (tmp_path / "home" / "tls.key.pem").read_text().splitlines()[2],
        "PEM private key": keys.identity.to_pem().decode(),
    }
    for label, text in leaks.items():
        log = tmp_path / "leak.log"
        log.write_text(f"DEBUG something {text} more\n")
        assert any(label in hit for hit in scan_for_secrets([log], needles)), label



async def _overlay_with_a_warm_asker(tmp_path):
    """An echo model node and six user nodes on a real overlay; the first has asked once, and the
    paths that ask used (single-use) are replaced."""
    from testkit.echo_model import EchoModelNode
    from testkit.localnet import start_user_nodes

    cloves, params = scenarios.scenario_params()
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory, cloves=cloves, params=params)
    await model.start()
    nodes = await start_user_nodes(6, directory, tmp_path, cloves=cloves, params=params, maintain=False)
    me = nodes[0]
    assert await me.paths.fill() >= cloves.n
    await me.ask("warm up")
    assert await me.paths.fill() >= cloves.n
    return model, nodes, me


def _fail_paths(me, count: int) -> None:
    for path in me.paths.pool.usable(me.paths.clock())[:count]:
        path.failed = True


@pytest.mark.timeout(60)
async def test_an_ask_with_fewer_than_n_paths_fails_after_the_path_wait_blaming_no_model_node(tmp_path):
    """Regression: with only k <= m < n paths left (repair could not build more), the asker
    split the query m ways, which the model node never decodes (it expects n-way cloves), and
    the user waited out the whole reply timeout (60 s by default). Then: an error at once, but
    one that marked the model node as failed, for this node's own shortage. Now: the ask waits
    path_wait_s for paths, then fails with code no_paths, and the model node keeps its place."""
    from user_client.asking import NO_PATHS, AskError

    model, nodes, me = await _overlay_with_a_warm_asker(tmp_path)
    cloves, params = scenarios.scenario_params()
    try:
        _fail_paths(me, cloves.n - cloves.k)

        async def no_relay_left():
            return None
        me.paths.build_one = no_relay_left
        with pytest.raises(AskError) as err:
            await asyncio.wait_for(me.ask("with k paths"), params.path_wait_s + params.first_reply_timeout_s / 2)
        assert err.value.code == NO_PATHS and "usable proxy paths" in str(err.value), err.value
        assert model.prompts == ["warm up"]  # nothing undecodable was sent
        assert not me.asker._failed_recently(model.keys.identity.node_id_hex)  # not the model node's fault
    finally:
        for n in nodes:
            await n.stop()
        await model.stop()


@pytest.mark.timeout(60)
async def test_an_ask_short_of_paths_waits_for_the_path_manager_to_build_them(tmp_path):
    """A node just started, or whose single-use paths the last asks used up, holds fewer than
    n paths for a few seconds. It used to fail the ask at once: a verifier's probing node then
    reported an honest model node missing (the demo's first epoch blamed its honest leader)."""
    model, nodes, me = await _overlay_with_a_warm_asker(tmp_path)
    cloves, params = scenarios.scenario_params()
    try:
        _fail_paths(me, cloves.proxies_kept)
        build = me.paths.build_one
        refused = []

        async def relays_not_yet_up():
            if len(refused) < 3 * cloves.proxies_kept:  # three rounds of fill find no relay
                refused.append(1)
                return None
            return await build()
        me.paths.build_one = relays_not_yet_up
        answer = await asyncio.wait_for(me.ask("after the paths came"), params.path_wait_s + params.first_reply_timeout_s)
        assert answer.served_by == model.keys.identity.node_id_hex and model.prompts[-1] == "after the paths came"
        assert len(refused) == 3 * cloves.proxies_kept
    finally:
        for n in nodes:
            await n.stop()
        await model.stop()


@pytest.mark.timeout(90)
async def test_a_relay_nobody_can_reach_does_not_take_the_guard_down_with_it(tmp_path):
    """Regression (test_wan_devnet, a user behind NAT listed as a relay): once two paths over
    the guard were built, the least-used choice put the unreachable relay on every new path;
    each failure suspected all its hops alike, so the guard was excluded with it, too few
    relays were left, the exclusions were cleared and the same path was tried again: a user
    stuck at 2 of 4 paths after 3,000 failed builds. A hop that carries a usable path now is
    not blamed: the unreachable relay alone is excluded and the user gets its paths."""
    import random
    from collections import Counter

    from testkit.localnet import start_user_nodes

    cloves, params = scenarios.scenario_params()
    nodes = await start_user_nodes(4, tmp_path / "directory.json", tmp_path, cloves=cloves, params=params,
                                   maintain=False)
    me = nodes[0]
    me.paths.rng = random.Random(3)  # one relay choice, every run
    try:
        me.paths._choose(Counter(), set())  # its guards: the three relays listed so far
        unreachable, = await start_user_nodes(1, tmp_path / "directory.json", tmp_path / "late", cloves=cloves,
                                              params=params, maintain=False)
        nodes.append(unreachable)
        await unreachable.stop()  # still listed, as a NAT'd user's router address is: a relay, not a guard
        await me.refresh_directory()
        me.paths.pool.keep = 2  # two paths first (the devnet's users built theirs as relays registered)
        assert await me.paths.wait_for(2, 10.0) == 2
        me.paths.pool.keep = cloves.proxies_kept
        for _ in range(5):
            if await me.paths.fill() >= cloves.proxies_kept:
                break
        status = me.paths.status()
        assert status["usable"] == cloves.proxies_kept, status
        assert all(unreachable.address not in p["relays"] for p in status["paths"]), status
    finally:
        for n in nodes:
            await n.stop()
