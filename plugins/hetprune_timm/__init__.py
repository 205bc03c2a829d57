"""Architecture adapters for timm's ViT families, as a hetprune plugin:
one file per family, registered through the public ``register_architectures``
hook like an outside package's adapters."""

import hetprune
from hetprune.plugin_api import Architecture, Register

from .beit import TimmBEiT
from .cait import TimmCaiT
from .eva import TimmEVA
from .swin import TimmSwin
from .vit import TimmViT

__version__ = hetprune.__version__


@hetprune.hookimpl
def register_architectures(register: Register[Architecture]) -> None:
    for adapter in (TimmViT, TimmCaiT, TimmBEiT, TimmEVA, TimmSwin):
        register(adapter)
