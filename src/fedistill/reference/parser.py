"""The command line's parser, walked: its subcommands and their arguments (`fedistill.cli.build_parser`)."""

from __future__ import annotations

import argparse

from fedistill import cli


def subcommands() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """Subcommand name -> (its one-line help, its parser), in the parser's order; a nested one (`deploy
    credentials`) by its full name, after its parent."""
    found: dict[str, tuple[str, argparse.ArgumentParser]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
                for name, sub in action.choices.items():
                    found[f"{prefix}{name}"] = (helps.get(name, ""), sub)
                    walk(sub, f"{prefix}{name} ")

    walk(cli.build_parser(), "")
    return found


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments of one subcommand, help flags left out."""
    return [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]


def run_flag_help() -> dict[str, str]:
    """Config key -> the help of the `fedistill run` flag that sets it, where the parser gives one: the
    flags of `cli.FLAG_KEYS`, and those named as a key (`--download`)."""
    _, run = subcommands()["run"]
    found = {}
    for action in arguments(run):
        key = cli.FLAG_KEYS.get(action.dest, action.dest) if action.option_strings else ""
        if key and (action.help or "").strip():
            found[key] = action.help.strip()
    return found
