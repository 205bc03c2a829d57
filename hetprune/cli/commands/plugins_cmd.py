"""List every loaded plugin, its version and the components it registered.

    hetprune plugins                 the table
    hetprune plugins --json          the same as JSON
    hetprune plugins --check         run the conformance kit (hetprune.harness.testing) on every component
    hetprune plugins --check NAME    ... on the components of plugin NAME, or the components named NAME

A check failing prints FAIL with the rule that was broken, and the command
exits 1 (like a test run).
"""

from __future__ import annotations

import json
import time

from ...core.errors import HetpruneError
from ...core.plugins import KINDS, get_registry

HELP = "list plugins and the components they registered; --check runs the conformance kit on them"


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--check", nargs="?", const="", metavar="NAME",
                   help="check every component (or those of plugin NAME, or named NAME) against the plugin "
                        "contract on tiny models")


def selected(registry, name: str) -> list[tuple[str, str]]:
    """``(kind, component)`` pairs to check: all, a plugin's, or the components called ``name``."""
    every = [(kind, comp) for info in registry.plugins() for kind, names in info.components.items() for comp in names]
    if not name:
        return sorted(every)
    by_plugin = [(k, c) for k, c in every if registry.component(k, c).plugin == name]
    by_name = [(k, c) for k, c in every if c == name]
    if not by_plugin and not by_name:
        plugins = ", ".join(i.name for i in registry.plugins()) or "(none)"
        raise HetpruneError(f"--check {name!r} names no plugin and no component; plugins: {plugins} "
                            "(`hetprune plugins` lists the components)")
    return sorted(set(by_plugin + by_name))


def check(registry, todo: list[tuple[str, str]]) -> int:
    import torch

    from ...harness import testing

    torch.set_num_threads(1)  # tiny models: one thread is the faster use of the cores
    failed = 0
    skipped = [(kind, name) for kind, name in todo if kind not in testing.CHECKS]
    for kind, name in skipped:
        print(f"skip  {kind:<13} {name:<18} ({registry.component(kind, name).plugin}) no conformance check for "
              "this kind", flush=True)
    todo = [t for t in todo if t not in skipped]
    for kind, name in todo:
        comp = registry.component(kind, name)
        started = time.time()
        try:
            testing.check(kind, comp.factory)
        except AssertionError as exc:
            failed += 1
            print(f"FAIL  {kind:<13} {name:<18} ({comp.plugin}) {exc}", flush=True)
            continue
        print(f"ok    {kind:<13} {name:<18} ({comp.plugin}) {time.time() - started:.1f}s", flush=True)
    print(f"{len(todo)} component{'s' if len(todo) != 1 else ''} checked: {len(todo) - failed} passed, {failed} failed"
          + (f", {len(skipped)} skipped" if skipped else ""))
    return 1 if failed else 0


def run(args) -> int:
    registry = get_registry()
    if args.check is not None:
        return check(registry, selected(registry, args.check))
    infos = registry.plugins()
    if args.json:
        print(json.dumps([{"name": i.name, "version": i.version, "source": i.source, "components": i.components}
                          for i in infos], indent=2))
        return 0
    for info in infos:
        version = f" {info.version}" if info.version else ""
        print(f"{info.name}{version}  ({info.source})")
        for kind in KINDS:
            for name in info.components.get(kind, []):
                desc = registry.component(kind, name).description
                print(f"    {kind:<13} {name:<18} {desc}")
    return 0
