"""MkDocs hook: write the command-line reference from hetprune's own argparse parsers.

The page docs/reference/cli.md holds a marker; at build time it is replaced by one section per
sub-command with its usage, description and every option (help and default), read from
``hetprune.cli.build_parser()``. The reference therefore cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARKER = "<!-- cli-reference -->"
ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from hetprune.cli import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion, e.g. %(default)s
        try:
            text = text % {**vars(action), "prog": prog}
        except (KeyError, TypeError, ValueError):
            pass
    return text


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._HelpAction,
                           argparse._VersionAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else ""
    value = action.default
    if value is None or value is argparse.SUPPRESS or value == []:
        return ""
    return f"`{value}`"


def _option(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.nargs != 0 and action.option_strings:
        metavar = action.metavar or action.dest.upper()
        if action.choices and not action.metavar:
            metavar = "{" + ",".join(map(str, action.choices)) + "}"
        names += f" `{metavar}`"
    return names


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        lines += ["", f"**{group.title}**", "", "| option | meaning | default |", "|---|---|---|"]
        for a in actions:
            lines.append(f"| {_cell(_option(a))} | {_cell(_help(a, parser.prog))} | {_cell(_default(a))} |")
    return lines


def _section(name: str, parser: argparse.ArgumentParser, level: str = "##") -> list[str]:
    lines = [f"{level} {name}", "", "```text", parser.format_usage().strip(), "```"]
    if parser.description:
        lines += ["", "```text", parser.description.strip("\n"), "```"]
    return lines + _options_table(parser) + [""]


def render() -> str:
    """The Markdown of the whole reference."""
    parser = _parser()
    subs = _subcommands(parser)
    lines = _section("hetprune", parser)
    lines += ["Sub-commands: " + ", ".join(f"[`{n}`](#hetprune-{n})" for n in subs) + ".", ""]
    for name, sub in subs.items():
        lines += _section(f"hetprune {name}", sub)
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown
