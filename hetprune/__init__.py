"""hetprune: structured pruning of Vision Transformers, extensible with plugins.

The public API for users and plugin authors is what this module exports.
"""

__version__ = "0.1.0"

from .errors import HetpruneError
from .hookspecs import hookimpl, hookspec
from .models import ModelSpec
from .plugins import get_registry, register_plugin, unregister_plugin
from .recipe import Recipe, apply_recipe, load, save
from .sites import Site, sites

__all__ = [
    "HetpruneError", "ModelSpec", "Recipe", "Site", "__version__", "apply_recipe", "get_registry", "hookimpl",
    "hookspec", "load", "register_plugin", "save", "sites", "unregister_plugin",
]
