"""GenTorrent verifier package."""
