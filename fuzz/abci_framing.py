"""atheris harness: the ABCI socket framing and request dispatch (verifier/abci/socket_server.py).

    .venv/bin/python fuzz/abci_framing.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/abci_framing.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("abci_framing", ["verifier.abci.socket_server"])
