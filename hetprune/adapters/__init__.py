"""Architecture adapters: everything one model family's internals mean for pruning.

The rest of hetprune asks the adapter of a model and never names a block
attribute itself. Built-in and outside adapters are components registered
through the ``register_architectures`` hook (built-ins: the ``timm`` and
``hf`` plugins); a user's own transformer gets one from :func:`generic`, and a
known model inside a larger module is found as a submodule (:class:`Nested`).

* :mod:`.base`: the :class:`Adapter` contract and :class:`PreNormAdapter`, which implements
  every operation for pre-norm blocks from a :class:`~hetprune.layers.BlockLayout`;
* :mod:`.generic`: :func:`generic`, an adapter from a block path and a layout;
* :mod:`.nested`: :class:`Nested`, an adapter's operations on a submodule;
* :mod:`.lookup`: :func:`adapter_for` and :func:`serving`, which model gets which adapter.
"""

from .base import DOCS, Adapter, PreNormAdapter, WidthInfo, attention_matmul_macs
from .generic import GenericPreNorm, generic
from .lookup import adapter_for, adapter_named, adapters, most_specific, serving
from .nested import Nested, find_nested

__all__ = ["DOCS", "Adapter", "GenericPreNorm", "Nested", "PreNormAdapter", "WidthInfo", "adapter_for",
           "adapter_named", "adapters", "attention_matmul_macs", "find_nested", "generic", "most_specific",
           "serving"]
