"""`fedistill deploy`: what an operator needs to run fedistill across real institutions on Flower.

    fedistill deploy credentials SITE [SITE ...] --superlink-host HOST --out DIR

    fedistill deploy site-folders --out DIR [--dataset ... --clients ... --alpha ...]

`credentials` (credentials.py): TLS certificates, one authentication key pair per site and the enrolment
that fixes each site's partition (docs: how-to/flower.md). `site-folders` (engine/site_folders.py): a
dataset's simulated partition as one folder per site and one for the server, to rehearse a deployment whose
sites hold only their own records.
"""

from __future__ import annotations

import argparse

from fedistill.engine import site_folders
from fedistill.engine.flower import credentials

STEPS = {
    "credentials": (credentials, "TLS certificates, site keys and the enrolment for a list of sites"),
    "site-folders": (site_folders, "a dataset's partition as one folder per site and one for the server"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    steps = parser.add_subparsers(dest="deploy_step", required=True, metavar="STEP", help="what to prepare")
    for name, (module, help_text) in STEPS.items():
        raw = argparse.RawDescriptionHelpFormatter  # the docstrings lay out tables and commands
        module.add_arguments(
            steps.add_parser(name, help=help_text, description=module.__doc__, formatter_class=raw)
        )


def run_command(args: argparse.Namespace) -> int:
    module, _ = STEPS[args.deploy_step]
    return module.run_command(args)
