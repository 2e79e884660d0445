"""`fedistill deploy`: what an operator needs to run fedistill across real institutions on Flower.

    fedistill deploy credentials SITE [SITE ...] --superlink-host HOST --out DIR

Only `credentials` so far (credentials.py): TLS certificates, one authentication key pair per site and
the enrolment that fixes each site's partition (docs: how-to/flower.md).
"""

from __future__ import annotations

import argparse

from fedistill.engine.flower import credentials

STEPS = {"credentials": (credentials, "TLS certificates, site keys and the enrolment for a list of sites")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    steps = parser.add_subparsers(dest="deploy_step", required=True, metavar="STEP", help="what to prepare")
    for name, (module, help_text) in STEPS.items():
        step = steps.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,  # its list of files as laid out
        )
        module.add_arguments(step)


def run_command(args: argparse.Namespace) -> int:
    module, _ = STEPS[args.deploy_step]
    return module.run_command(args)
