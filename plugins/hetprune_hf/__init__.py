"""Hugging Face ``transformers`` ViT as a hetprune plugin: the proof that a
family outside timm is one adapter on the public ``register_architectures``
hook. Needs ``pip install 'hetprune[hf]'`` (transformers >= 5) only when such a
model is built or pruned; loading this plugin imports nothing heavy."""

import hetprune
from hetprune.plugin_api import Architecture, Register

from .vit import HFViTAdapter, HFViTClassifier, wrap

__all__ = ["HFViTAdapter", "HFViTClassifier", "wrap"]
__version__ = hetprune.__version__


@hetprune.hookimpl
def register_architectures(register: Register[Architecture]) -> None:
    register(HFViTAdapter)
