"""A dishonest model node: the real `gt-model serve` with a cheater plugged in (testkit/cheaters.py).

    python -m testkit.dishonest_model --dishonest KIND serve --model smollm2-135m [gt-model serve options]

Everything after `--dishonest KIND` is `gt-model`'s own command line, run by its own code
(model_node.cli.main) through the one hook it takes for what it loads and what answers
(model_node.cli.Serving), so the cheater differs from an honest node in that alone. The
devnet, tests/test_epochs_live.py and bench/detection.py start their cheaters this way; the
product has no flag for it.
"""

from __future__ import annotations

import argparse
import sys

from testkit.cheaters import KINDS, Cheat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.dishonest_model", allow_abbrev=False,
                                     description="gt-model with a cheater plugged in (tests, devnet, benchmarks)")
    parser.add_argument("--dishonest", required=True, choices=KINDS, metavar="KIND",
                        help=f"how it cheats while claiming --model: {', '.join(KINDS)}")
    args, rest = parser.parse_known_args(argv)
    from model_node import cli

    return cli.main(rest, serving=Cheat(args.dishonest))


if __name__ == "__main__":
    sys.exit(main())
