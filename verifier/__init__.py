"""A verification node (`gt-verifier`): one member of the committee.

consensus   the embedded Tendermint engine (pure state machine, vote keeper, driver; WAL, node)
abci        the registry application (ABCI 2.0), its store, the CometBFT socket server
epochs      verification epochs: VRF leaders, challenges, scoring, reputation, the runner
dashboard   the read-only status page and /metrics
cli         `gt-verifier init | start | status`

A verifier probes model nodes through a user node of its own (epochs.overlay_prober), exactly
as a user asks: the one import of another role the architecture allows.
"""
