"""Widths of timm ViT-family models (the ``timm-vit`` adapter's width support):
read them from a model, reshape a fresh base model to them, and tell the
width pruner what it may cut.

A width-pruned model is saved as ``recipe.json`` + weights like any other; the
recipe's ``widths`` says every shape that differs from the base model, in a
form a person can read and diff::

    {"embed_dim": 304,
     "blocks": [{"attn": {"heads": 5, "head_dim": 40}, "mlp": {"hidden": 1248}},
                {"attn": "removed", "mlp": "merged"},
                "dropped", ...]}

* ``embed_dim`` — the residual width (patch embedding, tokens, every norm,
  every projection into and out of the residual stream, the head's input);
* per block: ``attn`` is ``{"heads", "head_dim"}`` (the qkv layer then has
  ``3 * heads * head_dim`` outputs, proj ``heads * head_dim`` inputs) or
  ``"removed"`` (a `HetBlock`); ``mlp`` is
  ``{"hidden"}`` (fc2 inputs: fc1 outputs of a plain MLP, also when the
  activation is removed but the MLP is not merged; for a gated MLP the width
  of each of its two halves, so a packed ``GluMlp``/``SwiGLUPacked`` fc1 has
  ``2 x hidden`` outputs and a ``SwiGLU`` has ``hidden`` in ``fc1_x`` and in
  ``fc1_g``) or ``"merged"`` (one ``embed_dim x embed_dim`` linear); a whole
  dropped block is ``"dropped"``.

`apply_widths` runs after the depth surgery of a recipe (removals and
merges) on a fresh base model and gives every layer the recorded shape, with
timm's ``Attention`` attributes (``num_heads``, ``head_dim``, ``attn_dim``,
``scale``) made consistent, so the saved state dict loads strictly.

Which channels were kept is recorded under ``"kept"`` by the width
strategies (``{"embed": [...] | null, "blocks": [{"attn": [...] | null, "mlp":
[...] | null} | "dropped"]}``: indices into the base model's embedding, its
attention width ``heads x head_dim`` and its MLP hidden width), so a recipe
applied to other weights of the same base keeps the same channels. A widths
record without it (hand-written, or older) keeps the leading channels of
every layer, with a warning.
"""

from __future__ import annotations

import warnings

import torch
from timm.layers import GluMlp, SwiGLU
from torch import nn

from hetprune import HetpruneError
from hetprune.plugin_api import adapters, surgery

WIDTHS_KEYS = ("embed_dim", "blocks")
KEPT_KEY = "kept"   # optional: which channels of the base model each layer kept
TOKEN_PARAMS = ("cls_token", "reg_token", "dist_token", "pos_embed")
MODEL_NORMS = ("norm_pre", "norm", "fc_norm")
HEADS = ("head", "head_dist")
ATTENTION_PARTS = ("qkv", "q_norm", "k_norm", "norm", "gate", "proj")  # the layers apply_widths cuts


# -- timm attention ------------------------------------------------------------
def is_attention(module: nn.Module) -> bool:
    """A timm-style attention module: one fused ``qkv`` linear and a ``proj``."""
    return all(hasattr(module, a) for a in ("num_heads", "head_dim", "qkv", "proj")) and \
        isinstance(module.qkv, nn.Linear) and isinstance(module.proj, nn.Linear)


def fix_attention(attn: nn.Module, num_heads: int) -> None:
    """Make ``num_heads``, ``head_dim``, ``attn_dim`` and ``scale`` agree with the layer shapes.

    ``scale`` becomes ``head_dim ** -0.5``: the fused path
    (``F.scaled_dot_product_attention``) uses exactly that for the actual q
    width, so both of timm's attention paths compute the same function.
    """
    attn_dim = attn.proj.in_features
    if num_heads < 1 or attn_dim % num_heads or attn.qkv.out_features != 3 * attn_dim:
        raise HetpruneError(
            f"inconsistent attention shapes: qkv has {attn.qkv.out_features} outputs, proj {attn_dim} inputs, "
            f"{num_heads} heads (need qkv = 3 x proj inputs = 3 x heads x head_dim)")
    attn.num_heads = int(num_heads)
    attn.head_dim = attn_dim // num_heads
    if hasattr(attn, "attn_dim"):
        attn.attn_dim = attn_dim
    attn.scale = attn.head_dim ** -0.5


def attention_problems(model: nn.Module) -> list[str]:
    """Every way an attention module's attributes disagree with its layers (empty when consistent)."""
    problems = []
    for name, m in model.named_modules():
        if not is_attention(m):
            continue
        attn_dim = m.num_heads * m.head_dim
        if m.qkv.out_features != 3 * attn_dim:
            problems.append(f"{name}: qkv has {m.qkv.out_features} outputs, expected 3 x {m.num_heads} x {m.head_dim}")
        if m.proj.in_features != attn_dim:
            problems.append(f"{name}: proj has {m.proj.in_features} inputs, expected {m.num_heads} x {m.head_dim}")
        if getattr(m, "attn_dim", attn_dim) != attn_dim:
            problems.append(f"{name}: attn_dim is {m.attn_dim}, expected {attn_dim}")
        if abs(m.scale - m.head_dim ** -0.5) > 1e-12:
            problems.append(f"{name}: scale is {m.scale}, expected head_dim ** -0.5 = {m.head_dim ** -0.5}")
        if m.qkv.in_features != m.proj.out_features:
            problems.append(f"{name}: qkv reads {m.qkv.in_features} channels but proj writes {m.proj.out_features}")
    return problems


def embed_dim_of(model: nn.Module) -> int:
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if isinstance(proj, nn.Conv2d):
        return int(proj.out_channels)
    norm = next((b.norm2 for b in model.blocks if hasattr(b, "norm2")), None)
    if norm is None:
        raise HetpruneError(f"cannot read the embedding width of {type(model).__name__}")
    return int(norm.normalized_shape[0])


def sync_model_attributes(model: nn.Module) -> None:
    """Set the model's integer width attributes (``embed_dim``, ``num_features``...) to its layers, and the
    channels of every ``feature_info`` level (each a block's output: the residual width), which timm's
    ``forward_intermediates`` users and features_only wrappers read."""
    embed = embed_dim_of(model)
    for attr in ("embed_dim", "num_features", "head_hidden_size"):
        if isinstance(getattr(model, attr, None), int):
            setattr(model, attr, embed)
    for info in getattr(model, "feature_info", None) or []:
        if isinstance(info, dict) and isinstance(info.get("num_chs"), int):
            info["num_chs"] = embed


# -- MLPs ----------------------------------------------------------------------
MLP_FORMS = ("a plain MLP (fc1, act, fc2: timm Mlp)", "a packed gated MLP (timm GluMlp, SwiGLUPacked)",
             "a gated MLP with separate halves (timm SwiGLU: fc1_x, fc1_g)")


def mlp_form(mlp: nn.Module, where: str) -> str:
    """``"plain"``, ``"packed"`` (one fc1 holding both gated halves), ``"split"`` (SwiGLU) or ``"merged"``.

    Anything else is refused here, before any pruning: its hidden width would be
    read (or cut) wrong, and the recipe would not reload.
    """
    if isinstance(mlp, surgery.MergedMlp):
        return "merged"
    if isinstance(mlp, SwiGLU) and all(isinstance(getattr(mlp, n, None), nn.Linear)
                                       for n in ("fc1_x", "fc1_g", "fc2")):
        return "split"
    if isinstance(mlp, GluMlp):
        if isinstance(mlp.fc1, nn.Linear) and isinstance(mlp.fc2, nn.Linear) and mlp.chunk_dim == -1 \
                and mlp.fc1.out_features == 2 * mlp.fc2.in_features:
            return "packed"
    elif isinstance(getattr(mlp, "fc1", None), nn.Linear) and isinstance(getattr(mlp, "fc2", None), nn.Linear) \
            and mlp.fc1.out_features == mlp.fc2.in_features \
            and set(dict(mlp.named_children())) <= {"fc1", "act", "drop1", "norm", "fc2", "drop2"} \
            and not list(mlp.parameters(recurse=False)):
        return "plain"
    raise HetpruneError(f"{where}: width pruning supports {', '.join(MLP_FORMS)}; this MLP is a "
                        f"{type(mlp).__name__} it cannot prune exactly")


def mlp_hidden(mlp: nn.Module, where: str) -> int:
    """The MLP's hidden width: fc2's inputs (half of a packed gated fc1's outputs)."""
    mlp_form(mlp, where)
    return int(mlp.fc2.in_features)


def _hidden_rows(mlp: nn.Module, e_idx: torch.Tensor | None, where: str) -> torch.Tensor:
    """One row per hidden channel: every weight that writes it (both halves of a gated MLP)."""
    form = mlp_form(mlp, where)
    cols = (lambda w: w if e_idx is None else w[:, e_idx])
    if form == "split":
        return torch.cat([cols(mlp.fc1_x.weight), cols(mlp.fc1_g.weight)], 1)
    w = cols(mlp.fc1.weight)
    if form == "packed":
        h = w.shape[0] // 2
        return torch.cat([w[:h], w[h:]], 1)
    return w


def _cut_mlp(mlp: nn.Module, h_idx: torch.Tensor, e_idx: torch.Tensor | None, where: str) -> None:
    """Keep hidden channels ``h_idx`` (and residual channels ``e_idx``) of a plain or gated MLP."""
    form = mlp_form(mlp, where)
    if form == "split":
        _linear(mlp.fc1_x, h_idx, e_idx)
        _linear(mlp.fc1_g, h_idx, e_idx)
    elif form == "packed":  # both halves keep the same channels: x.chunk(2) still pairs them up
        _linear(mlp.fc1, torch.cat([h_idx, h_idx + mlp.fc2.in_features]), e_idx)
    else:
        _linear(mlp.fc1, h_idx, e_idx)
    _norm(getattr(mlp, "norm", nn.Identity()), h_idx, f"{where}.norm")
    _linear(mlp.fc2, e_idx, h_idx)


def _split_rows(layer: nn.Linear, rows: slice) -> nn.Linear:
    """Rows ``rows`` of ``layer`` as a linear of their own, gradients included (Taylor importance)."""
    out = nn.Linear(layer.in_features, rows.stop - rows.start, bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    for name in ("weight", "bias"):
        old, new = getattr(layer, name), getattr(out, name)
        if old is None:
            continue
        with torch.no_grad():
            new.copy_(old[rows])
        new.requires_grad_(old.requires_grad)
        if old.grad is not None:
            new.grad = old.grad[rows].clone()
    return out


def _join_rows(first: nn.Linear, second: nn.Linear) -> nn.Linear:
    out = nn.Linear(first.in_features, first.out_features + second.out_features, bias=first.bias is not None,
                    device=first.weight.device, dtype=first.weight.dtype)
    for name in ("weight", "bias"):
        a, b, new = getattr(first, name), getattr(second, name), getattr(out, name)
        if a is None:
            continue
        with torch.no_grad():
            new.copy_(torch.cat([a, b]))
        new.requires_grad_(a.requires_grad)
    return out


class UnpackedGlu(nn.Module):
    """A packed ``GluMlp`` with its fc1 split in two linears, only while Torch-Pruning prunes it.

    Torch-Pruning cannot prune a packed gated fc1 (``x.chunk(2)``): it ranks
    its ``2 x hidden`` rows as if each were a channel and fails on fc2, which
    has only ``hidden`` inputs (Torch-Pruning issue 366). Split in two, the
    halves are coupled through the product like in ``SwiGLU``, which it prunes
    correctly; `repack_glu` puts the pruned halves back into one fc1.
    """

    def __init__(self, glu: GluMlp):
        super().__init__()
        h = glu.fc2.in_features
        first, second = _split_rows(glu.fc1, slice(0, h)), _split_rows(glu.fc1, slice(h, 2 * h))
        self.gate_last = glu.gate_last
        self.fc1_x, self.fc1_g = (first, second) if glu.gate_last else (second, first)
        self.act, self.drop1, self.norm, self.fc2, self.drop2 = glu.act, glu.drop1, glu.norm, glu.fc2, glu.drop2
        self.packed = [glu]  # a list: not a submodule, so Torch-Pruning does not see the old fc1

    def forward(self, x):
        x = self.fc1_x(x) * self.act(self.fc1_g(x))
        return self.drop2(self.fc2(self.norm(self.drop1(x))))


def unpack_glus(model: nn.Module) -> None:
    """Every packed gated MLP of ``model``'s blocks as an `UnpackedGlu`, in place."""
    for i, block in enumerate(model.blocks):
        mlp = getattr(block, "mlp", None)
        if (mlp is not None and not isinstance(block, surgery.DroppedBlock)
                and mlp_form(mlp, f"blocks.{i}.mlp") == "packed"):
            block.mlp = UnpackedGlu(mlp)


def repack_glu(model: nn.Module) -> None:
    """Undo `unpack_glus`: the (pruned) halves back in one packed fc1 of the original ``GluMlp``."""
    for block in model.blocks:
        u = getattr(block, "mlp", None)
        if isinstance(u, UnpackedGlu):
            glu = u.packed[0]
            halves = (u.fc1_x, u.fc1_g) if u.gate_last else (u.fc1_g, u.fc1_x)
            glu.fc1 = _join_rows(*halves)
            glu.act, glu.drop1, glu.norm, glu.fc2, glu.drop2 = u.act, u.drop1, u.norm, u.fc2, u.drop2
            block.mlp = glu


# -- reading -------------------------------------------------------------------
def read_widths(model: nn.Module) -> dict:
    """The widths of every layer of a (width-)pruned model, as plain JSON data."""
    problems = attention_problems(model)
    if problems:
        raise HetpruneError("cannot record widths: " + "; ".join(problems))
    blocks: list[dict | str] = []
    for i, block in enumerate(model.blocks):
        if isinstance(block, surgery.DroppedBlock):
            blocks.append("dropped")
            continue
        entry: dict = {}
        if isinstance(block, surgery.HetBlock):
            entry["attn"] = "removed"
        else:
            entry["attn"] = {"heads": int(block.attn.num_heads), "head_dim": int(block.attn.head_dim)}
        if isinstance(block.mlp, surgery.MergedMlp):
            entry["mlp"] = "merged"
        else:
            entry["mlp"] = {"hidden": mlp_hidden(block.mlp, f"blocks.{i}.mlp")}
        blocks.append(entry)
    return {"embed_dim": embed_dim_of(model), "blocks": blocks}


def _check_widths(widths: dict, depth: int) -> None:
    if not isinstance(widths, dict) or not set(WIDTHS_KEYS) <= set(widths) <= {*WIDTHS_KEYS, KEPT_KEY}:
        got = sorted(widths) if isinstance(widths, dict) else type(widths).__name__
        raise HetpruneError(f"recipe widths must be a mapping with the keys {WIDTHS_KEYS} (and optionally "
                            f"{KEPT_KEY!r}), got {got}")
    e = widths["embed_dim"]
    if not isinstance(e, int) or isinstance(e, bool) or e < 1:
        raise HetpruneError(f"recipe widths: embed_dim must be a positive integer, got {e!r}")
    blocks = widths["blocks"]
    if not isinstance(blocks, list) or len(blocks) != depth:
        n = len(blocks) if isinstance(blocks, list) else blocks
        raise HetpruneError(f"recipe widths list {n} blocks, but the model has {depth}")

    def positive(value, what, i):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HetpruneError(f"recipe widths, block {i}: {what} must be a positive integer, got {value!r}")

    for i, entry in enumerate(blocks):
        if entry == "dropped":
            continue
        if not isinstance(entry, dict) or set(entry) != {"attn", "mlp"}:
            raise HetpruneError(f"recipe widths, block {i}: expected \"dropped\" or {{\"attn\": ..., \"mlp\": ...}}, "
                                f"got {entry!r}")
        attn, mlp = entry["attn"], entry["mlp"]
        if attn != "removed":
            if not isinstance(attn, dict) or set(attn) != {"heads", "head_dim"}:
                raise HetpruneError(f"recipe widths, block {i}: attn must be \"removed\" or "
                                    f"{{\"heads\": H, \"head_dim\": D}}, got {attn!r}")
            positive(attn["heads"], "attn.heads", i)
            positive(attn["head_dim"], "attn.head_dim", i)
        if mlp != "merged":
            if not isinstance(mlp, dict) or set(mlp) != {"hidden"}:
                raise HetpruneError(f"recipe widths, block {i}: mlp must be \"merged\" or {{\"hidden\": H}}, got {mlp!r}")
            positive(mlp["hidden"], "mlp.hidden", i)


# -- reshaping -----------------------------------------------------------------
def _index(n: int, size: int, what: str) -> torch.Tensor:
    if n > size:
        raise HetpruneError(f"recipe widths ask for {n} {what}, but the base model has only {size}")
    return torch.arange(n)


def _take(param: torch.Tensor | None, dim: int, idx: torch.Tensor | None):
    if param is None or idx is None:
        return param
    new = param.data.index_select(dim, idx.to(param.device)).clone()
    return nn.Parameter(new, requires_grad=param.requires_grad) if isinstance(param, nn.Parameter) else new


def _linear(layer: nn.Linear, out_idx: torch.Tensor | None = None, in_idx: torch.Tensor | None = None) -> None:
    layer.weight = _take(_take(layer.weight, 0, out_idx), 1, in_idx)
    if layer.bias is not None:
        layer.bias = _take(layer.bias, 0, out_idx)
    layer.out_features, layer.in_features = layer.weight.shape


def _check_norm(norm: nn.Module | None, where: str) -> None:
    if norm is not None and not isinstance(norm, nn.Identity) and (
            not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1):
        raise HetpruneError(f"{where} is a {type(norm).__name__}; width recipes support LayerNorm (or none) here")


def _norm(norm: nn.Module, idx: torch.Tensor, where: str) -> None:
    _check_norm(norm, where)
    if isinstance(norm, nn.Identity):
        return
    if norm.weight is not None:
        norm.weight = _take(norm.weight, 0, idx)
    if norm.bias is not None:
        norm.bias = _take(norm.bias, 0, idx)
    norm.normalized_shape = (len(idx),)


def _layerscale(ls: nn.Module, idx: torch.Tensor) -> None:
    if hasattr(ls, "gamma"):
        ls.gamma = _take(ls.gamma, 0, idx)


def _attention(attn: nn.Module, heads: int, head_dim: int, e_idx: torch.Tensor, where: str,
               kept: list | None = None) -> None:
    if not is_attention(attn):
        raise HetpruneError(f"{where}: {type(attn).__name__} is not a timm Attention (fused qkv + proj)")
    h0, d0 = attn.num_heads, attn.head_dim
    _index(heads, h0, f"heads in {where}")
    _index(head_dim, d0, f"head dims in {where}")
    if kept is not None:
        inner = _kept(kept, heads * head_dim, h0 * d0, f"attention channels in {where}")
    else:
        inner = torch.tensor([h * d0 + d for h in range(heads) for d in range(head_dim)], dtype=torch.long)
    qkv_idx = torch.cat([inner + s * h0 * d0 for s in range(3)])
    _linear(attn.qkv, qkv_idx, e_idx)
    head_idx = inner[:head_dim] % d0
    for name in ("q_norm", "k_norm"):
        _norm(getattr(attn, name, nn.Identity()), head_idx, f"{where}.{name}")
    _norm(getattr(attn, "norm", nn.Identity()), inner, f"{where}.norm")
    if getattr(attn, "gate", None) is not None:
        _linear(attn.gate, inner, e_idx)
    _linear(attn.proj, e_idx, inner)
    fix_attention(attn, heads)


def _kept(indices, n: int, size: int, what: str) -> torch.Tensor:
    if (not isinstance(indices, list) or len(indices) != n or len(set(indices)) != n
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in indices)):
        raise HetpruneError(f"recipe widths: kept {what} must be {n} distinct indices within 0..{size - 1}")
    return torch.tensor(indices, dtype=torch.long)


def apply_widths(model: nn.Module, widths: dict, compute: bool = False, merge_pending: bool = False) -> nn.Module:
    """Give a fresh base model (depth surgery already replayed) the recorded widths, in place.

    ``merge_pending``: the linear MLPs the widths call merged are not merged
    yet; they are cut to their kept hidden channels (all, when none are
    recorded) and the residual width, and the caller merges them afterwards, so
    the merged layer is the one width pruning before or after the merge gave.

    ``compute=False`` (loading saved weights next): only the shapes matter.
    ``compute=True``: the current weights are cut to the leading channels of
    every layer; that keeps a random model random, but does not reproduce a
    width-pruned trained model (use [`hetprune.load`][hetprune.model.recipe.load] on its folder).
    """
    blocks = model.blocks
    _check_widths(widths, len(blocks))
    kept = widths.get(KEPT_KEY)
    if kept is not None and (not isinstance(kept, dict) or set(kept) != {"embed", "blocks"}
                             or not isinstance(kept["blocks"], list) or len(kept["blocks"]) != len(blocks)):
        raise HetpruneError(f"recipe widths: {KEPT_KEY!r} must be {{\"embed\": ..., \"blocks\": [one per block]}}")
    if compute and kept is None:
        warnings.warn("applying recipe widths to real weights keeps the leading channels of every layer; the "
                      "recipe does not record which channels width pruning kept, so only the saved weights "
                      "(hetprune.load) reproduce a width-pruned model's function", stacklevel=2)
    e_base = embed_dim_of(model)
    e_idx = _index(widths["embed_dim"], e_base, "embedding channels")
    if kept is not None and kept["embed"] is not None:
        e_idx = _kept(kept["embed"], widths["embed_dim"], e_base, "embedding channels")
    elif widths["embed_dim"] == e_base:
        e_idx = None  # leave the residual width untouched
    cut = (lambda p, dim: _take(p, dim, e_idx))

    with torch.no_grad():
        pe = getattr(model, "patch_embed", None)
        if e_idx is not None:
            if pe is None or not isinstance(getattr(pe, "proj", None), nn.Conv2d):
                raise HetpruneError(f"{type(model).__name__} has no patch_embed.proj convolution; "
                                    "cannot change its embedding width")
            pe.proj.weight = cut(pe.proj.weight, 0)
            if pe.proj.bias is not None:
                pe.proj.bias = cut(pe.proj.bias, 0)
            pe.proj.out_channels = widths["embed_dim"]
            _norm(getattr(pe, "norm", nn.Identity()), e_idx, "patch_embed.norm")
            for name in TOKEN_PARAMS:
                p = getattr(model, name, None)
                if isinstance(p, torch.Tensor):
                    setattr(model, name, cut(p, p.dim() - 1))
            for name in MODEL_NORMS:
                _norm(getattr(model, name, nn.Identity()), e_idx, name)
            for name in HEADS:
                head = getattr(model, name, None)
                if isinstance(head, nn.Linear):
                    _linear(head, None, e_idx)
                elif head is not None and not isinstance(head, nn.Identity):
                    raise HetpruneError(f"model.{name} is a {type(head).__name__}; width recipes support a Linear head")
            if getattr(model, "attn_pool", None) is not None:
                raise HetpruneError("models with an attention-pool head (global_pool='map') are not supported by "
                                    "width recipes")

        for i, (block, entry) in enumerate(zip(blocks, widths["blocks"])):
            where = f"blocks.{i}"
            if entry == "dropped" or isinstance(block, surgery.DroppedBlock):
                if entry != "dropped" or not isinstance(block, surgery.DroppedBlock):
                    raise HetpruneError(f"recipe widths and depth disagree at block {i}: widths say {entry!r}, "
                                        f"the model has a {type(block).__name__}")
                continue
            attn, mlp = entry["attn"], entry["mlp"]
            if (attn == "removed") != isinstance(block, surgery.HetBlock):
                raise HetpruneError(f"recipe widths and depth disagree at block {i}: widths say attn {attn!r}, "
                                    f"the model has a {type(block).__name__}")
            pending = merge_pending and mlp == "merged" and not isinstance(block.mlp, surgery.MergedMlp)
            if (mlp == "merged") != isinstance(block.mlp, surgery.MergedMlp) and not pending:
                raise HetpruneError(f"recipe widths and depth disagree at block {i}: widths say mlp {mlp!r}, "
                                    f"the model has a {type(block.mlp).__name__}")
            if e_idx is not None:
                _norm(block.norm2, e_idx, f"{where}.norm2")
                _layerscale(getattr(block, "ls2", nn.Identity()), e_idx)
                if hasattr(block, "norm1"):  # a full block, or a HetBlock in ln-residual mode
                    _norm(block.norm1, e_idx, f"{where}.norm1")
                _layerscale(getattr(block, "ls1", nn.Identity()), e_idx)
            block_kept = kept["blocks"][i] if kept is not None else {}
            if not isinstance(block_kept, dict):
                raise HetpruneError(f"recipe widths: kept channels of block {i} must be a mapping, got {block_kept!r}")
            if attn != "removed":
                _attention(block.attn, attn["heads"], attn["head_dim"],
                           e_idx, f"{where}.attn", block_kept.get("attn"))
            if mlp == "merged" and not pending:
                _linear(block.mlp.fc, e_idx, e_idx)
            else:
                base = mlp_hidden(block.mlp, f"{where}.mlp")
                if block_kept.get("mlp") is not None:
                    hidden = len(block_kept["mlp"]) if pending else mlp["hidden"]
                    h_idx = _kept(block_kept["mlp"], hidden, base, f"MLP hidden channels in {where}")
                else:
                    h_idx = _index(base if pending else mlp["hidden"], base, f"MLP hidden channels in {where}")
                _cut_mlp(block.mlp, h_idx, e_idx, f"{where}.mlp")
        sync_model_attributes(model)
    return model


# -- which channels were kept -------------------------------------------------------
def _match_rows(old: torch.Tensor, new: torch.Tensor, what: str) -> list[int]:
    """Indices ``i_j`` with ``new[j] == old[i_j]`` exactly (pruning selects rows, it does not change them)."""
    index: dict[bytes, int] = {}
    for i, row in enumerate(old.detach().flatten(1).cpu()):
        index.setdefault(row.numpy().tobytes(), i)
    found = [index.get(row.numpy().tobytes()) for row in new.detach().flatten(1).cpu()]
    kept = [i for i in found if i is not None]
    if len(kept) < len(found):
        raise HetpruneError(f"cannot tell which {what} width pruning kept: a pruned row matches no row of the model "
                            "before pruning (were the weights changed in between?)")
    return kept


def kept_channels(before: nn.Module, after: nn.Module) -> dict:
    """Which channels of ``before`` each layer of ``after`` kept (``after`` = ``before`` width-pruned)."""
    pe0, pe1 = before.patch_embed.proj, after.patch_embed.proj
    embed = _match_rows(pe0.weight, pe1.weight, "embedding channels")
    e_idx = torch.tensor(embed)
    blocks: list[dict | str] = []
    for i, (b0, b1) in enumerate(zip(before.blocks, after.blocks)):
        if isinstance(b1, surgery.DroppedBlock):
            blocks.append("dropped")
            continue
        entry: dict = {"attn": None, "mlp": None}
        if not isinstance(b1, surgery.HetBlock):
            a0, a1 = b0.attn, b1.attn
            rows = _match_rows(a0.qkv.weight[:, e_idx], a1.qkv.weight, f"attention channels of block {i}")
            width0, width1 = a0.qkv.out_features // 3, a1.qkv.out_features // 3
            inner = rows[:width1]
            if rows != [j + s * width0 for s in range(3) for j in inner]:
                raise HetpruneError(f"block {i}: width pruning kept different channels of q, k and v")
            entry["attn"] = inner
        if not isinstance(b1.mlp, surgery.MergedMlp):
            where = f"blocks.{i}.mlp"
            entry["mlp"] = _match_rows(_hidden_rows(b0.mlp, e_idx, where), _hidden_rows(b1.mlp, None, where),
                                       f"MLP channels of block {i}")
        blocks.append(entry)
    return {"embed": embed, "blocks": blocks}


def compose_kept(first: dict, then: dict) -> dict:
    """Kept channels of two width prunings in a row, relative to the model before the first."""
    def pick(outer, inner):  # None: that stage did not prune this layer (or it was gone or merged by then)
        return outer if inner is None else inner if outer is None else [outer[j] for j in inner]

    blocks: list[dict | str] = []
    for b0, b1 in zip(first["blocks"], then["blocks"]):
        if b1 == "dropped" or b0 == "dropped":
            blocks.append("dropped")
        else:
            blocks.append({k: pick(b0[k], b1[k]) for k in ("attn", "mlp")})
    return {"embed": pick(first["embed"], then["embed"]), "blocks": blocks}


def check_width_support(model: nn.Module) -> None:
    """Refuse, before any pruning, a model whose widths `apply_widths` could not replay.

    The same checks `apply_widths` makes, run up front, so an unsupported
    layer stops a run at its start, not at the reload check after pruning and
    fine-tuning.
    """
    if getattr(model, "attn_pool", None) is not None:
        raise HetpruneError("models with an attention-pool head (global_pool='map') are not supported by "
                            "width recipes")
    for name in HEADS:
        head = getattr(model, name, None)
        if head is not None and not isinstance(head, (nn.Linear, nn.Identity)):
            raise HetpruneError(f"model.{name} is a {type(head).__name__}; width recipes support a Linear head")
    pe = getattr(model, "patch_embed", None)
    if not isinstance(getattr(pe, "proj", None), nn.Conv2d):
        raise HetpruneError(f"{type(model).__name__} has no patch_embed.proj convolution (the layer that writes the "
                            "embedding width); width pruning supports patch-embedded ViTs")
    _check_norm(getattr(pe, "norm", None), "patch_embed.norm")
    for name in MODEL_NORMS:
        _check_norm(getattr(model, name, None), name)
    for i, block in enumerate(model.blocks):
        if isinstance(block, surgery.DroppedBlock):
            continue
        where = f"blocks.{i}"
        for name in ("norm1", "norm2"):
            _check_norm(getattr(block, name, None), f"{where}.{name}")
        if not isinstance(block, surgery.HetBlock):
            if not is_attention(block.attn):
                raise HetpruneError(f"{where}.attn: {type(block.attn).__name__} is not a timm Attention (fused qkv "
                                    "+ proj); width pruning supports only that")
            for name in ("q_norm", "k_norm", "norm"):
                _check_norm(getattr(block.attn, name, None), f"{where}.attn.{name}")
            extra = [n for n, m in block.attn.named_children() if n not in ATTENTION_PARTS
                     and next(m.parameters(), None) is not None]
            if extra:  # e.g. relpos's per-head bias tables: pruning heads would have to cut them too
                raise HetpruneError(f"{where}.attn ({type(block.attn).__name__}) has layers width pruning does not "
                                    f"know how to cut: {', '.join(extra)}; it supports {', '.join(ATTENTION_PARTS)}")
        if mlp_form(block.mlp, f"{where}.mlp") != "merged":
            _check_norm(getattr(block.mlp, "norm", None), f"{where}.mlp.norm")


def width_info(model: nn.Module) -> adapters.WidthInfo:
    """What the width pruner needs: attention modules and heads, layers to leave alone, bare parameters,
    and how to show Torch-Pruning a packed gated MLP (split in two while it prunes)."""
    check_width_support(model)
    attns = [m for m in model.modules() if is_attention(m)]
    unwrapped = []
    for name in TOKEN_PARAMS:
        p = getattr(model, name, None)
        if isinstance(p, nn.Parameter):
            unwrapped.append((p, p.dim() - 1))
    for m in model.modules():
        if isinstance(getattr(m, "gamma", None), nn.Parameter) and m.gamma.dim() == 1:
            unwrapped.append((m.gamma, 0))
    return adapters.WidthInfo(
        attentions=[(a, a.qkv, int(a.num_heads)) for a in attns],
        ignored_layers=[getattr(model, n) for n in HEADS if isinstance(getattr(model, n, None), nn.Linear)],
        embed_input=model.patch_embed.proj,
        unwrapped=unwrapped,
        fix_attention=fix_attention,
        sync=sync_model_attributes,
        prepare=unpack_glus,
        restore=repack_glu,
    )
