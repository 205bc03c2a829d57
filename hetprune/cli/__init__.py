"""The ``hetprune`` command line: one sub-command per module in
``hetprune/commands``. Every command takes ``--plugin MODULE`` (repeatable).

User mistakes ([`HetpruneError`][hetprune.core.errors.HetpruneError]) and plugin faults ([`PluginError`][hetprune.core.errors.PluginError],
naming the plugin) print one ``error:`` line and exit 2; ``--debug`` or
``HETPRUNE_DEBUG=1`` also prints the traceback. hetprune's own bugs keep theirs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__
from ..core.errors import HetpruneError, command_line_messages
from ..core.plugins import load_module

COMMANDS = ("plugins", "apply", "prune", "compare", "bench", "ablate", "export")


def _command_module(name: str):
    return importlib.import_module(f"hetprune.cli.commands.{name}_cmd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetprune",
        description="Structured pruning of Vision Transformers (HetDPT, HetDPT+, baselines), "
                    "extensible with plugins.",
    )
    parser.add_argument("--version", action="version", version=f"hetprune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = _command_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == f"hetprune.cli.commands.{name}_cmd":
                continue
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="load one more plugin module by import path (repeatable)")
        p.add_argument("--debug", action="store_true",
                       help="show the full traceback of errors (also HETPRUNE_DEBUG=1)")
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def one_line(message: str, debug: bool = False) -> str:
    """An error is one line: a message that runs on (a library's text quoted in it) is cut at its first line,
    and the rest is left to --debug, whose traceback holds all of it."""
    message = worker_message(message)
    first, _, rest = message.strip().partition("\n")
    if not rest.strip():
        return first
    return first if debug else f"{first} (--debug shows the rest)"


def worker_message(message: str) -> str:
    """The message of an error raised in a DataLoader worker (an unreadable image), which torch re-raises as
    ``Caught HetpruneError in DataLoader worker process 0.`` followed by the worker's traceback: the
    traceback's last line, without its exception's name."""
    if not message.startswith("Caught ") or "Original Traceback" not in message:
        return message
    last = [line for line in message.strip().splitlines() if line.strip()][-1]
    name, sep, text = last.partition(": ")
    return text if sep and name.split(".")[-1].endswith(("Error", "Exception")) else last


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in result files
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        with command_line_messages():   # errors name this command's options, not a Python call's arguments
            for module_name in args.plugin:
                load_module(module_name)
            # commands that train resolve --device and join torchrun's process group themselves
            return int(args._run(args) or 0)
    except HetpruneError as exc:  # a PluginError names the plugin; --debug adds the traceback
        import os
        import traceback

        debug = getattr(args, "debug", False) or os.environ.get("HETPRUNE_DEBUG", "") not in ("", "0")
        if debug:
            traceback.print_exception(exc)
        print(f"error: {one_line(str(exc), debug)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(interrupted_message(args), file=sys.stderr)
        return 130
    finally:
        # a command leaves no loader worker behind (persistent, pinned workers made exit wait on each of them)
        if "hetprune.training.loaders" in sys.modules:
            sys.modules["hetprune.training.loaders"].close_loaders()
        # a command that joined torchrun's process group leaves it, error or not (none: torch not loaded)
        if "hetprune.core.distributed" in sys.modules:
            sys.modules["hetprune.core.distributed"].shutdown()


def interrupted_message(args) -> str:
    """What Ctrl-C leaves: the finished work that was saved (and how to continue from it), or nothing."""
    from ..core.io import saved_work

    saved = saved_work()
    if not saved:
        return "interrupted before any work finished: nothing was saved; rerun the command to start again"
    more = " with --resume to continue" if hasattr(args, "resume") else ""
    return (f"interrupted: finished work is saved ({len(saved)} piece{'s' if len(saved) > 1 else ''}, the last "
            f"{saved[-1]}); rerun the same command{more}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
