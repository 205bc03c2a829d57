"""The conformance kit (hetprune.harness.testing) passes on every built-in component.

These are the built-in plugins' own conformance tests: one per component of
every plugin shipped in hetprune's distribution, named plugin:kind:name, each
running the check a plugin author runs (and ``hetprune plugins --check``).
A kind of component with a check in ``testing.CHECKS`` is covered here as soon
as a built-in plugin registers one.
"""

from __future__ import annotations

import pytest
import torch

from hetprune.core import plugins
from hetprune.harness import testing


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


# -- the reload check runs for an adapter without example_spec too ---------------------------------

def _adapter_without_example_spec():
    from hetprune_timm.vit import TimmViT

    class Unnamed(TimmViT):
        """A family hetprune cannot build by name: its tiny models come from make_model only."""

        name = "unnamed-vit"
        example_spec = None

    return Unnamed


def _shifted_model(shift: float):
    """The tiny ViT plus a constant logit shift kept outside its state dict (a non-persistent buffer)."""
    model = testing.tiny_model()
    model.register_buffer("shift", torch.full((10,), shift), persistent=False)
    model.register_forward_hook(lambda m, args, out: out + m.shift)
    return model


@pytest.fixture
def no_builtin_adapters(monkeypatch):
    monkeypatch.setenv("HETPRUNE_PLUGINS", "hetdpt,baselines,width")  # no built-in adapter claims the model
    plugins.reset()
    yield
    monkeypatch.delenv("HETPRUNE_PLUGINS")
    plugins.reset()


def test_without_example_spec_the_kit_reloads_onto_a_fresh_make_model(no_builtin_adapters):
    """The reload check is not skipped: state a recipe and weights cannot carry (here a buffer that differs
    between two make_model() calls) fails it; the same family without that state passes."""
    adapter = _adapter_without_example_spec()
    calls = []

    def drifting():
        calls.append(1)
        return _shifted_model(float(len(calls)))

    with pytest.raises(testing.ConformanceError, match="does not reload bit-identically from its recipe and "
                                                       "weights onto a fresh make_model\\(\\) base"):
        testing.check_architecture(adapter, make_model=drifting)
    testing.check_architecture(adapter, make_model=lambda: _shifted_model(0.5))
