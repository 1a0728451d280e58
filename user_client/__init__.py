"""gt-user: a user node of the anonymous overlay.

node        UserNode: relay for others, keep proxy paths, ask (the programmatic API)
paths       choosing relays, establishing, renewing and repairing proxy paths
asking      seal, split, send over n paths, collect k reply cloves, retry, session affinity
directory   the Directory interface and its static JSON-file implementation
committee   the committee-backed Directory (light-client-checked registry, registration txs)
openai_api  local OpenAI-compatible HTTP API (+ gt-user's control endpoints)
cli         the gt-user command
localnet    small loopback networks for tests, benchmarks and the demo
"""
