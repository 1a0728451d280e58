"""Verification epochs (DESIGN.md §3.5): pure cores the committee shell drives.

vrf.py         ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381) and VRF leader election
challenges.py  prompt commitments, probe sets, reveals, the question seed plan
scoring.py     credibility of a reply from one teacher-forced reference pass
reputation.py  R(T) with sliding-window punishment; trusted / untrusted
epoch.py       ProcessProposal checks of the leader's result, missing-reply resolution,
               faulty-leader detection, the credibilities FinalizeBlock applies
"""
