"""The command line's reference, read from the parser `fedistill.cli.build_parser` builds: every
subcommand, and every flag with its config key and help. A flag without help text takes the doc of the
config key it sets (`cli.FLAG_KEYS`), so a flag and its key are described once."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from fedistill import cli
from fedistill.config import RunConfig
from fedistill.reference.config_keys import common_keys
from fedistill.reference.markdown import cell, table
from fedistill.reference.parser import arguments, subcommands

#: Help for the arguments the parser leaves without it and that set no config key; each entry goes as
#: soon as cli.py gives the argument a `help=` (tests/test_docs.py fails on an entry the parser covers).
ARGUMENT_NOTES: dict[str, str] = {}


#: The common config keys, which a flag of the same name sets.
COMMON = frozenset(f.name for f in dataclasses.fields(RunConfig)) - {"options"}


@dataclass(frozen=True)
class Flag:
    """One argument of one subcommand, as the reference shows it."""

    command: str
    dest: str  # the parser's name for it (`data_dir`)
    names: str  # "--data-dir DATA_DIR", or the positional's name
    key: str  # the config key it sets, "" for none
    help: str  # the parser's help, else the config key's doc, else ARGUMENT_NOTES'
    own_help: bool  # whether the parser itself gives the help


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.dest
    name = max(action.option_strings, key=len)
    takes_value = action.nargs != 0 and not isinstance(
        action, (argparse._StoreTrueAction, argparse._StoreFalseAction)
    )
    metavar = action.metavar or action.dest.upper()
    return f"{name} {metavar}" if takes_value else name


def _config_key(action: argparse.Action) -> str:
    """The config key a flag sets: `cli.FLAG_KEYS`' entry, or the key of its own name (`--download`)."""
    if not action.option_strings:
        return ""
    return cli.FLAG_KEYS.get(action.dest) or (action.dest if action.dest in COMMON else "")


def flags() -> list[Flag]:
    """Every argument of every subcommand (help and version flags left out)."""
    docs = {key.name: key.doc for key in common_keys()}
    result = []
    for command, (_, parser) in subcommands().items():
        for action in arguments(parser):
            key = _config_key(action) if command == "run" else ""  # other commands build no RunConfig
            own = (action.help or "").strip()
            text = own or docs.get(key, "") or ARGUMENT_NOTES.get(f"{command} {action.dest}", "")
            if action.choices and own:
                text += f" ({', '.join(map(str, action.choices))})"
            result.append(Flag(command, action.dest, _names(action), key, text, bool(own)))
    return result


def cli_markdown() -> str:
    """The page `reference/cli.md`."""
    parts = [
        "# Command line",
        "",
        "Generated from the parser in `fedistill/cli.py`. Later sources win: the defaults, `--config`, "
        "the flags, then `--set`; any [config key](config.md) can be given with `--set KEY=VALUE` "
        "(values are TOML literals).",
        "",
    ]
    by_command: dict[str, list[Flag]] = {}
    for flag in flags():
        by_command.setdefault(flag.command, []).append(flag)
    for command, (summary, _) in subcommands().items():
        parts += [f"## `fedistill {command}`", "", cell(summary) + ".", ""]
        rows = [(f"`{f.names}`", f"`{f.key}`" if f.key else "", f.help) for f in by_command.get(command, [])]
        parts += [table(("argument", "config key", "meaning"), rows) if rows else "No arguments.", ""]
    return "\n".join(parts)
