"""atheris harness: consensus message decoding and handling (types.decode_message, Driver.on_message).

    .venv/bin/python fuzz/consensus.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/consensus.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("consensus", ["gentorrent.ledger.chain", "verifier.consensus.driver", "verifier.consensus.state_machine",
                       "verifier.consensus.votes", "verifier.consensus.gossip"])
