"""atheris harness: the S-IDA clove decoder (sida.combine).

    .venv/bin/python fuzz/sida.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/sida.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("sida", ["gentorrent.crypto.sida", "gentorrent.crypto.gf256"])
