"""Fault scenarios shared by the tests (tests/test_faults_*.py) and the results table
(bench/reliability.py): each is `async def name(root, seed, quick) -> dict` with the keys of
bench.reliability.Outcome (requests_sent, answered, lost, failed_clearly, committed_txs_lost,
forks, recover_s, note, extra); the tests assert on that dict, the bench prints it.

Every scenario builds its own real processes/servers under `root` on 127.0.0.1 and tears
them down; `seed` fixes every random choice (which node dies when), so a failure replays.

One module per role: `verifiers`, `relays`, `models`, `epochs` (the committee's judgement);
`adversary_*` modules replay attacks (THREAT_MODEL.md) and report the attacker's success (an
attack that succeeds counts as lost): `adversary_groups` by a model-group member,
`adversary_path` on the anonymous path, `adversary_registry` on the registry and directory.
Every public scenario is re-exported here, so bench/reliability.py finds it by name.
"""

from testkit.scenarios.adversary_groups import GROUP_ATTACKS, group_adversary
from testkit.scenarios.adversary_path import (ADVERSARY_SCENARIOS, adv_address_hijack, adv_link_theft,
                                              adv_model_amplify, adv_nonce_reuse, adv_onion_replay, adv_peer_quota,
                                              adv_position_alone, adv_position_timing, adv_replay_flush, adv_reply_linking,
                                              adv_sizes_tokens, adv_tagging)
from testkit.scenarios.adversary_registry import directory_replay, registry_hijack
from testkit.scenarios.epochs import EPOCH_MODES, epoch_faults
from testkit.scenarios.models import MODEL_MODES, model_faults
from testkit.scenarios.relays import (LINK_DELAY_S, LINK_PHASES, RELAY_CLOVES_K, RELAY_CLOVES_N,
                                                 RELAY_MODES, RELAY_PROCESS_MODES, RELAY_PROCESSES, relay_faults,
                                                 relay_process_faults, scenario_params)
from testkit.scenarios.verifiers import (CRASH_POINTS, QUICK_CRASH_POINTS, verifier_byzantine,
                                         verifier_clock_skew, verifier_crash_points, verifier_gossip,
                                         verifier_kills, verifier_partitions)

__all__ = [
    "GROUP_ATTACKS", "group_adversary",
    "ADVERSARY_SCENARIOS", "adv_address_hijack", "adv_link_theft", "adv_model_amplify", "adv_nonce_reuse",
    "adv_onion_replay", "adv_peer_quota", "adv_position_alone", "adv_position_timing", "adv_replay_flush", "adv_reply_linking",
    "adv_sizes_tokens", "adv_tagging",
    "directory_replay", "registry_hijack",
    "EPOCH_MODES", "epoch_faults",
    "MODEL_MODES", "model_faults",
    "LINK_DELAY_S", "LINK_PHASES", "RELAY_CLOVES_K", "RELAY_CLOVES_N", "RELAY_MODES", "RELAY_PROCESS_MODES",
    "RELAY_PROCESSES", "relay_faults", "relay_process_faults", "scenario_params",
    "CRASH_POINTS", "QUICK_CRASH_POINTS", "verifier_byzantine", "verifier_clock_skew", "verifier_crash_points",
    "verifier_gossip", "verifier_kills", "verifier_partitions",
]
