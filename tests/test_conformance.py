"""The conformance kit (hetprune.testing) passes on every built-in component.

These are the built-in plugins' own conformance tests: one per component of
every plugin shipped in hetprune's distribution, named plugin:kind:name, each
running the check a plugin author runs (and ``hetprune plugins --check``).
A kind of component with a check in ``testing.CHECKS`` is covered here as soon
as a built-in plugin registers one.
"""

from __future__ import annotations

import pytest

from hetprune import plugins, testing


def builtin_components() -> list[tuple[str, str, str]]:
    registry = plugins.get_registry()
    found = [(info.name, kind, name) for info in registry.plugins() if registry.origin(info.name).builtin
             for kind, names in info.components.items() if kind in testing.CHECKS for name in names]
    plugins.reset()
    return sorted(found)


COMPONENTS = builtin_components()


def test_the_builtin_plugins_cover_every_kind_the_kit_checks():
    assert {"hetdpt", "baselines", "width"} <= {p for p, _, _ in COMPONENTS}
    assert {k for _, k, _ in COMPONENTS} == set(testing.CHECKS)


@pytest.mark.parametrize("plugin, kind, name", COMPONENTS, ids=[":".join(c) for c in COMPONENTS])
def test_builtin_component_keeps_the_plugin_contract(plugin, kind, name):
    testing.check(kind, plugins.get_registry().component(kind, name).factory)
