"""The conformance kit (hetprune.testing) passes on every built-in component.

These are the built-in plugins' own conformance tests: one per component,
named plugin:kind:name, each running the same check a plugin author runs
(and ``hetprune plugins --check``).
"""

from __future__ import annotations

import pytest

from hetprune import plugins, testing

BUILTIN = ("hetdpt", "baselines", "width")


def builtin_components() -> list[tuple[str, str, str]]:
    registry = plugins.get_registry()
    found = [(info.name, kind, name) for info in registry.plugins() if info.name in BUILTIN
             for kind, names in info.components.items() for name in names]
    plugins.reset()
    return sorted(found)


COMPONENTS = builtin_components()


def test_every_builtin_plugin_and_component_kind_is_covered():
    assert {p for p, _, _ in COMPONENTS} == set(BUILTIN)
    assert {k for _, k, _ in COMPONENTS} == set(plugins.KINDS) == set(testing.CHECKS)


@pytest.mark.parametrize("plugin, kind, name", COMPONENTS, ids=[":".join(c) for c in COMPONENTS])
def test_builtin_component_keeps_the_plugin_contract(plugin, kind, name):
    testing.check(kind, plugins.get_registry().component(kind, name).factory)
