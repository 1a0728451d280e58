"""atheris harness: the HR-tree delta merge (HRTree.merge_delta).

    .venv/bin/python fuzz/hrtree.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/hrtree.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("hrtree", ["gentorrent.routing.hrtree", "gentorrent.routing.chunking"])
