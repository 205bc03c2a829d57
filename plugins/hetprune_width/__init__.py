"""Width pruning for hetprune, as a plugin: the ``isomorphic`` width pruner
(Torch-Pruning isomorphic global pruning to a MAC target) and two strategies,
``isomorphic`` (width only) and ``hetdpt-plus`` (HetDPT depth + width).
Uses only the public plugin API."""

import hetprune

from .pruner import IsomorphicWidthPruner
from .strategies import HetDPTPlus, Isomorphic

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_width_pruners(register):
    register(IsomorphicWidthPruner)


@hetprune.hookimpl
def register_strategies(register):
    register(Isomorphic)
    register(HetDPTPlus)
