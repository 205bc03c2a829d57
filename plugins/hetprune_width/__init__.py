"""Width pruning for hetprune, as a plugin: the ``isomorphic`` width pruner
(Torch-Pruning isomorphic global pruning to a MAC target) and two strategies,
``isomorphic`` (width only) and ``hetdpt-plus`` (HetDPT depth + width).
Uses only the public plugin API."""

import hetprune
from hetprune.plugin_api import Register, Strategy, WidthPruner

from .pruner import IsomorphicWidthPruner
from .strategies import HetDPTPlus, Isomorphic

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_width_pruners(register: Register[WidthPruner]) -> None:
    register(IsomorphicWidthPruner)


@hetprune.hookimpl
def register_strategies(register: Register[Strategy]) -> None:
    register(Isomorphic)
    register(HetDPTPlus)
