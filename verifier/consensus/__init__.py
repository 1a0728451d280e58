"""Embedded Tendermint consensus of the verification committee (DESIGN.md §3.6).

Pure core (no I/O, deterministic, tested by seeded simulation):
    types.py          blocks, proposals, votes, commits and their canonical signed encodings;
                      the validator set with CometBFT's weighted proposer rotation
    votes.py          vote keeper: power per (round, type, value), equivocation evidence
    state_machine.py  one height of "The latest gossip on BFT consensus" (Algorithm 1)
    driver.py         events (proposal, vote, timeout, decided block) -> effects
                      (broadcast, start timer, decide, need block), signing through a Signer
Shell:
    privval.py        the signer that never signs two different messages for one step
    wal.py            write-ahead log of the inputs of the height in progress
    blockstore.py     decided blocks with their commits (SQLite)
    node.py           gRPC/TLS Verifier service, peers, timers, mempool, catch-up, the app
    home.py           config.json of a verifier home; the committee of a genesis
The command is verifier/cli.py (`gt-verifier`); the light client is gentorrent/ledger/light_client.py.
"""
