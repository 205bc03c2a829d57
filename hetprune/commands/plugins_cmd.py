"""List every loaded plugin, its version and the components it registered."""

from __future__ import annotations

import json

from ..plugins import KINDS, get_registry

HELP = "list plugins and the components they registered"


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    registry = get_registry()
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
