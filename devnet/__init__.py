"""A local network that runs what a deployment runs, and the demo on top of it.

network     `gt-devnet up | status | ask | down`: a committee, model nodes and user nodes on
            127.0.0.1, each a real process
demo        `make demo`: a question through the overlay, a cheater caught
supervisor  starting, recording and stopping those processes
"""
