"""gt-user: a user node of the anonymous overlay.

node        UserNode: relay for others, keep proxy paths, ask (the programmatic API)
relay       the Relay gRPC service every user node runs (Establish, Forward, Return)
paths       choosing relays, establishing, renewing and repairing proxy paths
asking      seal, split, send over n paths, collect k reply cloves, retry, session affinity
openai_api  local OpenAI-compatible HTTP API (+ gt-user's control endpoints)
cli         the gt-user command
"""
