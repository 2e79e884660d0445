"""Credentials for an authenticated Flower deployment of fedistill (same as `fedistill deploy credentials`).

    python scripts/deployment/make_credentials.py hospital-a hospital-b hospital-c \
        --superlink-host link.example.org --out deployment-credentials

writes a CA, the SuperLink's TLS certificate and key, one ECDSA (P-384) authentication key pair per
site, and `enrolment.toml`, which fixes site i at partition i. It prints the commands the operator
and each site run next; docs/how-to/flower.md walks through them.
"""

from __future__ import annotations

import argparse
import sys

from fedistill.engine.flower.credentials import add_arguments, run_command


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    add_arguments(parser)
    return run_command(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
