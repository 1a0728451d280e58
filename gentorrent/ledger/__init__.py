"""The ledger every role shares: what the committee certifies and how a node checks it.

genesis       the committee's genesis file and its validator set
chain         blocks, proposals, votes, commits, the validator set (canonical signed encodings)
sections      the replicated state's sections, one record type per entity, the app hash
signed_tx     the signed, sequenced envelope of every transaction
txs           registry transactions (users, model nodes) and their stateless checks
epoch_txs     verification-epoch transactions and their stateless checks
light_client  checking a directory reply against the genesis committee (ARCHITECTURE.md §3.1)
directory     the Directory interface nodes work from; a static JSON-file implementation
committee     the committee-backed Directory (light-client checked), registration
"""
