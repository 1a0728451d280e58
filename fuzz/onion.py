"""atheris harness: the onion decoders (onion.peel, peel_forward, open_forward, unwrap_return).

    .venv/bin/python fuzz/onion.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/onion.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("onion", ["gentorrent.crypto.onion"])
