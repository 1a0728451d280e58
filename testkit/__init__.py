"""Test tooling that ships with the package: a fault-injecting TCP proxy and fuzz oracles."""
