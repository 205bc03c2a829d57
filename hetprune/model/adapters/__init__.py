"""Architecture adapters: everything one model family's internals mean for pruning.

The rest of hetprune asks the adapter of a model and never names a block
attribute itself. Built-in and outside adapters are components registered
through the ``register_architectures`` hook (built-ins: the ``timm`` and
``hf`` plugins); a user's own transformer gets one from `generic`, and a
known model inside a larger module is found as a submodule (`Nested`).

* `base`: the `Adapter` contract and `PreNormAdapter`, which implements
  every operation for pre-norm blocks from a [`BlockLayout`][hetprune.model.block_modules.BlockLayout];
* `generic`: `generic`, an adapter from a block path and a layout;
* `nested`: `Nested`, an adapter's operations on a submodule;
* `lookup`: `adapter_for` and `serving`, which model gets which adapter.
"""

from .base import DOCS, Adapter, PreNormAdapter, WidthInfo, attention_matmul_macs
from .generic import GenericPreNorm, generic
from .lookup import adapter_for, adapter_named, adapters, most_specific, serving
from .nested import Nested, find_nested

__all__ = ["DOCS", "Adapter", "GenericPreNorm", "Nested", "PreNormAdapter", "WidthInfo", "adapter_for",
           "adapter_named", "adapters", "attention_matmul_macs", "find_nested", "generic", "most_specific",
           "serving"]
