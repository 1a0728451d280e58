"""Verification epochs (ARCHITECTURE.md §3.5): pure cores, and the shell that drives them.

machine.py     THE epoch: one pure state machine the registry application runs in FinalizeBlock
               (every committed epoch transaction and every block end), its phases and their
               transition table, deadlines, missing-reply decisions, the close that updates
               reputations; parameters from chain state (gentorrent/ledger/chain_params.py)
vrf.py         ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381) and VRF leader election
challenges.py  prompt commitments, probe sets, reveals, drawing a challenge from user traffic
scoring.py     credibility of a reply from one teacher-forced reference pass
reputation.py  R(T) with sliding-window punishment and probation; trusted / untrusted
audits.py      the audit desk's sample of users' audited replies, the audit score, its folding
donations.py   users' audited asks kept for challenges; repeats.py: outputs already seen per node
private.py     sealed, signed reveals of challenge prompts between members (pure)
reply_commitments.py  public digests of the leader's private replies, and their checks
probe_format.py  a challenge is built by the users' own request builder (pure)

shells:
runner.py      this member's part of each epoch phase, as signed epoch transactions
audit_service.py  this member's audit desk over time (scoring with the reference model)
reference.py   the reference model, reached over a model node's Generate/Score RPCs
overlay_prober.py  probing as an ordinary user node through the anonymous overlay
wiring.py      `gt-verifier start --epochs`: attaches the runner to a verifier node

The transactions' formats and stateless checks are gentorrent/ledger/epoch_txs.py.
"""
