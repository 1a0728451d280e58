"""atheris harness: the TOML node configuration parser (settings.parse, settings.load).

    .venv/bin/python fuzz/settings.py -max_total_time=600 [corpus_dir]

The oracle is testkit/fuzzing/settings.py; see fuzz/README.md.
"""

from _harness import main

if __name__ == "__main__":
    main("settings", ["gentorrent.settings", "gentorrent.config"])
