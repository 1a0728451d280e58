"""Verification epochs (ARCHITECTURE.md §3.5): pure cores, and the shell that drives them.

vrf.py         ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381) and VRF leader election
challenges.py  prompt commitments, probe sets, reveals, the question seed plan
scoring.py     credibility of a reply from one teacher-forced reference pass
reputation.py  R(T) with sliding-window punishment; trusted / untrusted
epoch.py       ProcessProposal checks of the leader's result, missing-reply resolution,
               faulty-leader detection, the credibilities FinalizeBlock applies
private.py     sealed, signed reveals of challenge prompts between members (pure)
probe_format.py  a challenge is built by the users' own request builder (pure)
rules.py       the replicated epoch rules the registry application applies (phases, attested
               median scores, reputation updates)

shells:
runner.py      this member's part of each epoch phase, as signed epoch transactions
reference.py   the reference model, reached over a model node's Generate/Score RPCs
overlay_prober.py  probing as an ordinary user node through the anonymous overlay
wiring.py      `gt-verifier start --epochs`: attaches the runner to a verifier node

The replicated rules (phases, attested median scores, reputation updates) are in
verifier/epochs/rules.py and epoch_txs.py.
"""
