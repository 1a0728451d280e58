"""Test tooling: stand-in nodes, fault injection, scripted committees, fuzz oracles.

No product package imports it (the import contracts in pyproject.toml say so).

echo_model   the echo stand-in model node, honest or misbehaving on purpose
localnet     a few user nodes on 127.0.0.1 sharing a static directory file
faultproxy   a fault-injecting TCP proxy; faketime: libfaketime for clock-skew drills
committee    real verifier processes behind fault proxies; epochs: scripted epoch committees
leader_faults  a leader that drops, alters, forges or omits replies (plugs into the epoch runner)
keyleaks     finding secret key material in logs
scenarios    the fault scenarios shared by tests/test_faults_*.py and bench/reliability.py
fuzzing      fuzz oracles shared by atheris (fuzz/) and the hypothesis tests
replay       recorded blocks into a fresh registry app, in a process whose own defaults differ
"""
