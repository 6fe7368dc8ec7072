"""``python -m truba.daemon``: the daemon alone, without the rest of the ``truba`` command line."""

from __future__ import annotations

import argparse
import sys

from truba.daemon.cli import add_arguments, main


def run() -> int:
    parser = argparse.ArgumentParser(prog="python -m truba.daemon", description="run a compute daemon")
    add_arguments(parser)
    return main(parser.parse_args())


if __name__ == "__main__":
    sys.exit(run())
