"""GenTorrent sims package."""
