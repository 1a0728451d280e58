"""Embedded Tendermint consensus of the verification committee (ARCHITECTURE.md §3.6).

Pure core (no I/O, deterministic, tested by seeded simulation); the message types (blocks,
proposals, votes, commits, the validator set) are gentorrent/ledger/chain.py, which light
clients share:
    votes.py          vote keeper: power per (round, type, value), equivocation evidence
    state_machine.py  one height of "The latest gossip on BFT consensus" (Algorithm 1)
    driver.py         events (proposal, vote, timeout, decided block, peer round state) ->
                      effects (broadcast, send to a peer, start timer, decide, need block),
                      signing through a Signer
    gossip.py         round states and relays: each node passes on what a peer lacks
Shell:
    privval.py        the signer that never signs two different messages for one step
    wal.py            write-ahead log of the inputs of the height in progress
    blockstore.py     decided blocks with their commits (SQLite)
    node.py           ConsensusNode: peers, timers, mempool, catch-up, and the application it drives,
                      known only through verifier.abci.interface (verifier/node.py, the composition
                      root, builds the application and serves the Verifier RPCs; pyproject.toml's
                      import contract keeps this package from importing any application module)
    home.py           config.json of a verifier home
The command is verifier/cli.py (`gt-verifier`); the light client is gentorrent/ledger/light_client.py.
"""
