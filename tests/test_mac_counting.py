"""Issue 26, item 3: every timm model an adapter accepts is counted right, or refused with one clear error.

The names come from timm itself: every registered name in a timm module that
holds a model class some adapter claims (``model_types``), so a new timm
variant lands here and fails the test instead of being counted wrong. Each is
built tiny; names whose tiny builds have the same structure (they differ only
in size) are checked once. ``count_macs`` must equal FlopCounterMode's count
(math SDPA backend, FLOPs / 2) within 0.01 %, with timm's fused attention and
with its explicit matmuls; a refused model must be refused by ``adapter_for``
with a HetpruneError that names the model and the module type it refuses.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import pkgutil
import warnings

import pytest
import timm
import timm.models
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hetprune import HetpruneError
from hetprune.model.adapters import adapter_for, adapters
from hetprune.model.macs import count_macs

TINY = dict(num_classes=10, in_chans=3, img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2)
# a timm module whose names need other kwargs to build tiny (None drops a key), and why
BY_MODULE = {
    "swin_transformer": dict(depths=(1, 1), num_heads=(1, 2), window_size=4, embed_dim=16, patch_size=2, depth=None),
    "cait": dict(depth_token_only=1),
    # a CNN backbone is the patch embedding: it sets the stride (patch 1 on its features); 64 px gives tokens
    "vision_transformer_hybrid": dict(img_size=64, patch_size=None),
    # the conv stem's last width is the embedding width, so the width stays the name's own
    "vitamin": dict(img_size=64, patch_size=None, embed_dim=None, num_heads=None, depth=1),
}
BY_NAME = {
    "vit_base_mci_224": dict(embed_dim=None, num_heads=None),  # no projection after its conv stem
    "*sapiens2*": dict(num_kv_heads=1),  # grouped-query attention: one kv head per entry of the default depth
}
TOLERANCE = 1e-4  # 0.01 %


def claimed_modules() -> list[str]:
    """timm modules holding a model class (or subclass) that a registered adapter claims."""
    types = tuple(t for a in adapters() for t in getattr(a, "model_types", ()))
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm's deprecated alias modules warn on import
        for info in pkgutil.iter_modules(timm.models.__path__):
            module = importlib.import_module(f"timm.models.{info.name}")
            if any(inspect.isclass(v) and issubclass(v, types) for v in vars(module).values()):
                found.append(info.name)
    return found


def tiny_kwargs(module: str, name: str) -> dict:
    kwargs = {**TINY, **BY_MODULE.get(module, {})}
    for pattern, changes in BY_NAME.items():
        if fnmatch.fnmatch(name, pattern):
            kwargs.update(changes)
    return {k: v for k, v in kwargs.items() if v is not None}


def structure(model: nn.Module) -> tuple:
    """What two names share when they differ only in size: classes, module tree and parameter names."""
    return (type(model).__name__, tuple((n, type(m).__name__) for n, m in model.named_modules()),
            tuple(n for n, _ in model.named_parameters()), getattr(model, "global_pool", None))


def representatives() -> dict[str, tuple]:
    """One ``name -> (model, kwargs, names like it)`` per distinct tiny structure."""
    groups: dict[tuple, list] = {}
    for module in claimed_modules():
        for name in timm.list_models(module=module):
            kwargs = tiny_kwargs(module, name)
            torch.manual_seed(0)
            model = timm.create_model(name, **kwargs).eval()  # a name that cannot be built tiny fails here
            groups.setdefault(structure(model), [name, model, kwargs, []])[3].append(name)
    return {name: (model, kwargs, names) for name, model, kwargs, names in groups.values()}


@pytest.fixture(scope="module")
def models():
    return representatives()


def flop_counter_macs(model: nn.Module, x: torch.Tensor) -> float:
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:  # the fused CPU kernels have no FLOP formula
        model(x)
    return counter.get_total_flops() / 2 / x.shape[0]


def unfused(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if getattr(m, "fused_attn", False):
            m.fused_attn = False  # timm's explicit q @ kᵀ and attn @ v
    return model


@pytest.mark.slow  # about a minute on one core: some 330 names built tiny, 70 structures counted twice
def test_every_accepted_timm_model_is_counted_like_the_flop_counter_and_every_other_is_refused(models):
    wrong, unclear, accepted = [], [], 0
    for name, (model, kwargs, names) in models.items():
        try:
            adapter_for(model)
        except HetpruneError as exc:  # refused: the message names the model and the module type it refuses
            types = {type(m).__name__ for m in model.modules() if m is not model}
            if type(model).__name__ not in str(exc) or not any(t in str(exc) for t in types):
                unclear.append(f"{name}: {exc}")
            continue
        accepted += 1
        x = torch.randn(2, 3, kwargs["img_size"], kwargs["img_size"], generator=torch.Generator().manual_seed(0))
        for path in ("fused", "explicit"):  # the explicit pass flips the flags only after the fused one
            m = model if path == "fused" else unfused(model)
            macs, reference = count_macs(m, x), flop_counter_macs(m, x)
            if abs(macs - reference) > TOLERANCE * reference:
                wrong.append(f"{name} ({path} attention; also {', '.join(names[1:]) or 'no other name'}): "
                             f"count_macs {macs} vs FlopCounterMode {reference:.0f}")
    assert not wrong, "counted wrong:\n" + "\n".join(wrong)
    assert not unclear, "refused without naming the model and module type:\n" + "\n".join(unclear)
    assert accepted >= 40  # the enumeration found the families (not an empty pass)


@pytest.mark.slow
def test_the_enumeration_reaches_the_variants_that_were_once_counted_low(models):
    """Differential attention and the attention-pool head were undercounted; both must be in the check."""
    covered = {n for _, _, names in models.values() for n in names}
    assert {"vit_dwee_patch16_reg1_gap_256", "vit_base_patch16_siglip_224", "naflexvit_base_patch16_map",
            "vit_pe_core_base_patch16_224"} <= covered
    kinds = {type(m).__name__ for model, _, _ in models.values() for m in model.modules()}
    assert {"DiffAttention", "AttentionPoolLatent"} <= kinds


class _EinsumMixer(nn.Module):
    """Parameter-free attention over the tokens, its scores computed with einsum, which count_macs cannot size."""

    def forward(self, x):
        scores = torch.einsum("bnd,bmd->bnm", x, x).softmax(-1)
        return scores @ x


def test_a_product_that_cannot_be_sized_is_one_clear_error_naming_the_module():
    model = timm.create_model("vit_tiny_patch16_224", **TINY).eval()
    model.norm = _EinsumMixer()
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(HetpruneError, match=r"norm \(_EinsumMixer\).*torch\.einsum"):
        count_macs(model, x)
