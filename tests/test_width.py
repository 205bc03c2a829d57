"""Width pruning (plugin ``width``): the isomorphic width pruner, recipe widths
(read, replay, exact round trip), merge-only-where-it-pays, and the
``isomorphic`` / ``hetdpt-plus`` strategies through the CLI. Tiny models only."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from timm.layers import GluMlp, Mlp, SwiGLU, SwiGLUPacked
from torch import nn

import hetprune
from hetprune import HetpruneError
from hetprune.model import surgery
from hetprune.model.macs import count_macs
from hetprune.model.spec import ModelSpec, build
from hetprune.model.recipe import arch_of, recipe_from_model
from hetprune.model.widths import apply_widths, read_widths, track_kept
from hetprune_timm.vit_widths import attention_problems


WIDE = ModelSpec("vit_tiny_patch16_224", dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=64,
                                             depth=4, num_heads=4, init_values=0.1))
TOL = 0.02


def tiny_example(n: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 16, 16, generator=gen)


def wide_model(seed: int = 0):
    torch.manual_seed(seed)
    return build(WIDE)


def pruner(**options):
    return hetprune.get_registry().build("width_pruner", "isomorphic", **options)


def depth_pruned(model, mode="identity", fold_norm=False, merge=True):
    """attention gone in block 1, activations gone in blocks 2 and 3, block 3 merged."""
    surgery.remove_attention(model, 1, mode)
    surgery.remove_activation(model, 2)
    surgery.remove_activation(model, 3)
    if merge:
        surgery.merge_mlp(model, 3, fold_norm=fold_norm)
    return model


def replay(spec, model, fold_norm=False):
    """What hetprune.load does: fresh base model + the recipe's depth surgery + widths, shapes only."""
    recipe = recipe_from_model(model, spec, arch_of(build(spec)), fold_norm=fold_norm, widths=read_widths(model))
    fresh = hetprune.apply_recipe(build(spec), recipe, compute_merge=False)
    fresh.load_state_dict(model.state_dict(), strict=True)
    return fresh.eval(), recipe


def test_plugin_registers_pruner_and_strategies():
    reg = hetprune.get_registry()
    assert "isomorphic" in reg.names("width_pruner")
    assert {"isomorphic", "hetdpt-plus"} <= set(reg.names("strategy"))
    info = {p.name: p for p in reg.plugins()}["width"]
    assert info.components == {"width_pruner": ["isomorphic"], "strategy": ["hetdpt-plus", "isomorphic"]}


def test_width_pruning_meets_target_keeps_forward_and_attention_consistent():
    model = wide_model()
    x = tiny_example()
    dense = count_macs(model, x)
    report = pruner().prune(model, 0.5 * dense, x)
    macs = count_macs(model, x)
    assert 0.5 * dense * (1 - TOL) <= macs <= 0.5 * dense
    assert report["within_tolerance"] and report["macs"] == macs
    assert model(x).shape == (4, 10) and torch.isfinite(model(x)).all()
    assert attention_problems(model) == []
    for block in model.blocks:
        a = block.attn
        assert a.qkv.out_features == 3 * a.num_heads * a.head_dim == 3 * a.attn_dim
        assert a.proj.in_features == a.attn_dim and a.scale == a.head_dim ** -0.5
    w = read_widths(model)
    assert w["embed_dim"] == model.embed_dim == model.patch_embed.proj.out_channels < 64
    assert all(b["mlp"]["hidden"] % 8 == 0 for b in w["blocks"])  # round_to 8
    # both of timm's attention paths compute the same function after pruning
    fused = model(x)
    for block in model.blocks:
        block.attn.fused_attn = False
    assert torch.allclose(model(x), fused, atol=1e-5)


def test_progressive_steps_meet_the_target():
    model = wide_model(2)
    x = tiny_example()
    dense = count_macs(model, x)
    report = pruner(steps=2).prune(model, 0.4 * dense, x)
    assert len(report["stages"]) == 2 and report["stages"][0]["target"] > report["stages"][1]["target"]
    assert 0.4 * dense * (1 - TOL) <= count_macs(model, x) <= 0.4 * dense
    assert attention_problems(model) == []


@pytest.mark.parametrize("mode,fold_norm", [("identity", False), ("ln-residual", True)])
def test_depth_and_width_recipe_round_trips_exactly(tmp_path, mode, fold_norm):
    model = depth_pruned(wide_model(), mode=mode, fold_norm=fold_norm).eval()
    x = tiny_example()
    target = 0.45 * count_macs(model, x)
    pruner().prune(model, target, x)
    macs = count_macs(model, x)
    assert target * (1 - TOL) <= macs <= target
    w = read_widths(model)
    assert w["blocks"][1]["attn"] == "removed" and w["blocks"][3]["mlp"] == "merged"
    assert w["blocks"][2]["mlp"]["hidden"] < 256  # a linear, unmerged MLP keeps a prunable hidden width
    recipe = recipe_from_model(model, WIDE, arch_of(build(WIDE)), fold_norm=fold_norm, widths=w)
    hetprune.save(tmp_path / "m", model, recipe)
    loaded = hetprune.load(tmp_path / "m")
    assert torch.equal(loaded(x), model(x))
    assert read_widths(loaded) == w and attention_problems(loaded) == []
    # timm's feature levels say the pruned width, in the pruned model and in the one replayed from its recipe
    assert [f["num_chs"] for f in model.feature_info] == [f["num_chs"] for f in loaded.feature_info] == \
        [w["embed_dim"]] * len(model.blocks)
    assert json.loads((tmp_path / "m" / "recipe.json").read_text())["widths"] == w


def test_width_then_depth_pruned_model_round_trips(tmp_path):
    """Width first, then sites removed from the narrow model (HetBlock, RemovedActivation), then merge."""
    model = wide_model(1).eval()
    x = tiny_example()
    pruner().prune(model, 0.6 * count_macs(model, x), x)
    depth_pruned(model, merge=False)
    # which linear MLPs should merge, decided from their widths before merging (in x out < hidden x (in + out))
    pays = [b for b in (2, 3) if model.blocks[b].mlp.fc1.out_features * 2 > model.blocks[b].mlp.fc1.in_features]
    surgery.merge_all(model)
    fresh, recipe = replay(WIDE, model)
    assert torch.equal(fresh(x), model(x))
    assert recipe.merged == pays


def test_merge_is_skipped_where_it_would_not_pay():
    model = depth_pruned(wide_model(), merge=False)  # blocks 2 and 3: linear MLPs, hidden 256, D = 64
    widths = read_widths(model)
    widths["blocks"][2]["mlp"]["hidden"] = 16   # < D/2: fc1 + fc2 = 2*64*16 < 64*64 MACs per token
    widths["blocks"][3]["mlp"]["hidden"] = 40   # > D/2: one 64x64 linear is cheaper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_widths(model, widths, compute=True)
    assert not surgery.merge_pays(model.blocks[2].mlp) and surgery.merge_pays(model.blocks[3].mlp)
    assert sorted(surgery.merge_all(model)) == [3]
    assert not isinstance(model.blocks[2].mlp, surgery.MergedMlp)
    assert isinstance(model.blocks[3].mlp, surgery.MergedMlp)


def test_width_pruner_counts_the_cost_it_is_given():
    """With a cost that counts linear MLPs as merged, the target holds for the merged model."""
    from hetprune_width.strategies import WidthContext

    model = depth_pruned(wide_model(), merge=False).eval()
    x = tiny_example()

    def merged_macs(m):
        twin = copy.deepcopy(m)
        surgery.merge_all(twin)
        return count_macs(twin, x)

    target = 0.5 * merged_macs(model)
    pruner().prune(model, target, x, WidthContext(macs_fn=merged_macs, log=lambda m: None))
    assert count_macs(model, x) > target  # unmerged, it costs more...
    merged = sorted(surgery.merge_all(model))
    assert target * (1 - TOL) <= count_macs(model, x) <= target  # ...merged, it meets the target
    assert merged == [b for b in (2, 3) if isinstance(model.blocks[b].mlp, surgery.MergedMlp)]


def test_taylor_importance_needs_data_and_uses_it(digits_data):
    from hetprune.training.loaders import loader
    from hetprune_width.strategies import WidthContext

    model = wide_model().eval()
    x = tiny_example()
    with pytest.raises(HetpruneError, match="needs training data"):
        pruner(importance="taylor").prune(model, 0.6 * count_macs(model, x), x)

    def batches():
        for i, batch in enumerate(loader(digits_data.train, 32, shuffle=False)):
            if i == 2:
                break
            yield batch

    before = {n: p.clone() for n, p in model.state_dict().items()}
    pruner(importance="taylor").prune(model, 0.6 * count_macs(model, x), x, WidthContext(batches=batches))
    assert count_macs(model, x) <= 0.6 * count_macs(build(WIDE), x)
    assert all(p.grad is None for p in model.parameters())
    assert model.state_dict().keys() == before.keys()


def test_apply_widths_refuses_bad_or_mismatched_widths():
    model = wide_model()
    widths = read_widths(model)
    with pytest.raises(HetpruneError, match="list 3 blocks"):
        apply_widths(build(WIDE), {**widths, "blocks": widths["blocks"][:3]})
    with pytest.raises(HetpruneError, match="only 64"):
        apply_widths(build(WIDE), {**widths, "embed_dim": 65})
    bad = copy.deepcopy(widths)
    bad["blocks"][0]["attn"]["heads"] = 0
    with pytest.raises(HetpruneError, match="positive integer"):
        apply_widths(build(WIDE), bad)
    bad = copy.deepcopy(widths)
    bad["blocks"][1]["attn"] = "removed"  # the fresh model still has block 1's attention
    with pytest.raises(HetpruneError, match="disagree at block 1"):
        apply_widths(build(WIDE), bad)
    with pytest.raises(HetpruneError, match="with the keys .* optionally .kept."):
        apply_widths(build(WIDE), {"embed_dim": 64})


def test_recipe_with_widths_replays_on_hetprune_apply_path():
    """compute=True (hetprune apply on a base model): shapes as recorded, a warning that channels are leading."""
    model = depth_pruned(wide_model()).eval()
    x = tiny_example()
    pruner().prune(model, 0.5 * count_macs(model, x), x)
    recipe = recipe_from_model(model, WIDE, arch_of(build(WIDE)), widths=read_widths(model))
    with pytest.warns(UserWarning, match="leading channels"):
        other = hetprune.apply_recipe(build(WIDE), recipe, compute_merge=True)
    assert read_widths(other) == read_widths(model)
    assert count_macs(other, x) == count_macs(model, x)


# -- gated MLPs -------------------------------------------------------------------------

GATED = {   # timm's gated MLPs in a plain timm VisionTransformer (in memory: a class is no JSON kwarg)
    "swiglu-packed": dict(mlp_layer=SwiGLUPacked, act_layer=nn.SiLU),   # DINOv2-giant's: gate in the first half
    "glu": dict(mlp_layer=GluMlp),                                      # sigmoid gate in the second half
    "swiglu": dict(mlp_layer=SwiGLU, act_layer=nn.SiLU),                # EVA02's and AIMv2's: fc1_x and fc1_g
}


def gated_spec(key: str) -> ModelSpec:
    return ModelSpec(WIDE.name, {**WIDE.kwargs, **GATED[key]})


def gated_model(key: str, seed: int = 0):
    """A tiny gated-MLP ViT whose gates matter (timm starts a GluMlp's gate near a constant)."""
    torch.manual_seed(seed)
    model = build(gated_spec(key))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def gate_halves(mlp) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, gate) weights of a gated MLP, one row per hidden channel."""
    if isinstance(mlp, SwiGLU):
        return mlp.fc1_x.weight, mlp.fc1_g.weight
    first, second = mlp.fc1.weight.chunk(2)
    return (first, second) if mlp.gate_last else (second, first)


@pytest.mark.parametrize("depth_first", [False, True], ids=["width", "depth+width"])
@pytest.mark.parametrize("key", list(GATED))
def test_gated_mlp_width_pruning_records_true_hidden_widths_and_reloads_exactly(key, depth_first):
    """Both halves of a gated MLP keep the same channels; the recipe records the gated width (fc2 inputs,
    half a packed fc1) and replays on a fresh base model, the saved weights loading strictly."""
    spec = gated_spec(key)
    model = gated_model(key)
    if depth_first:   # gated MLPs in blocks 0 and 1, gates removed (linear MLPs) in 2 and 3, block 3 merged
        depth_pruned(model)
    x = tiny_example()
    base = copy.deepcopy(model)
    target = 0.5 * count_macs(model, x)
    pruner().prune(model, target, x)
    track_kept(base, model)
    assert target * (1 - TOL) <= count_macs(model, x) <= target
    w = read_widths(model)
    for i, (b0, b1, entry) in enumerate(zip(base.blocks, model.blocks, w["blocks"])):
        if isinstance(b1.mlp, surgery.MergedMlp):
            continue
        hidden = entry["mlp"]["hidden"]
        assert hidden == b1.mlp.fc2.in_features and hidden < b0.mlp.fc2.in_features
        if isinstance(b1.mlp, (GluMlp, SwiGLU)):
            value, gate = gate_halves(b1.mlp)
            assert value.shape[0] == gate.shape[0] == hidden   # a packed fc1 has 2 x hidden outputs
            # the kept value and gate rows belong to the same channels of the base model
            v0, g0 = gate_halves(b0.mlp)
            kept = w["kept"]["blocks"][i]["mlp"]
            e = w["kept"]["embed"]
            assert torch.equal(value, v0[kept][:, e]) and torch.equal(gate, g0[kept][:, e])
    assert sum(isinstance(b.mlp, (GluMlp, SwiGLU)) for b in model.blocks) == (2 if depth_first else 4)
    fresh, recipe = replay(spec, model)   # a fresh base model + the recipe, the weights loaded strictly
    assert torch.equal(fresh(x), model(x)) and read_widths(fresh) == w
    # the recipe's kept channels applied to the base weights give the pruned model's function
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "leading channels" warning: the kept channels are recorded
        again = hetprune.apply_recipe(gated_model(key), recipe, compute_merge=True)
    assert torch.allclose(again(x), model(x), atol=1e-5)


class ScaledMlp(Mlp):
    """An MLP with a per-hidden-channel scale of its own: width pruning does not know to cut it."""

    def __init__(self, in_features, hidden_features=None, **kwargs):
        super().__init__(in_features, hidden_features, **kwargs)
        self.scale = nn.Parameter(torch.ones(hidden_features))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)) * self.scale)


def test_an_mlp_width_pruning_cannot_replay_is_refused_before_pruning():
    model = build(ModelSpec(WIDE.name, {**WIDE.kwargs, "mlp_layer": ScaledMlp}))
    x = tiny_example()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(HetpruneError, match=r"blocks\.0\.mlp: width pruning supports .*GluMlp.*SwiGLU.*ScaledMlp"):
        pruner().prune(model, 0.5 * count_macs(model, x), x)
    after = model.state_dict()   # untouched: refused before any pruning
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    with pytest.raises(HetpruneError, match="ScaledMlp"):
        read_widths(model)


UNREPLAYABLE = {   # timm-vit models whose widths apply_widths cannot replay: (name, tiny kwargs, message)
    "relpos": ("vit_relpos_small_patch16_224", dict(embed_dim=32, depth=2, num_heads=2),
               r"blocks\.0\.attn \(RelPosAttention\) has layers width pruning does not know how to cut: rel_pos"),
    "aimv2-rmsnorm": ("aimv2_large_patch14_224", dict(embed_dim=32, depth=2, num_heads=2),
                      "patch_embed.norm is a RmsNorm; width recipes support LayerNorm"),
    "naflexvit": ("naflexvit_base_patch16_gap", dict(embed_dim=32, depth=2, num_heads=2),
                  "NaFlexVit has no patch_embed.proj convolution"),
    "map-pool": ("vit_tiny_patch16_224", dict(embed_dim=32, depth=2, num_heads=2, global_pool="map"),
                 "attention-pool head|AttentionPool"),   # refused here, or by the adapter (issue 26, item 3)
}


@pytest.mark.parametrize("key", list(UNREPLAYABLE))
def test_a_model_whose_widths_cannot_replay_is_refused_before_pruning(key):
    """One clear error at the start of width pruning, not a crash inside Torch-Pruning or at the reload check."""
    name, kwargs, message = UNREPLAYABLE[key]
    torch.manual_seed(0)
    model = build(ModelSpec(name, dict(img_size=16, in_chans=1, num_classes=10, patch_size=4, **kwargs)))
    x = tiny_example()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(HetpruneError, match=message):
        pruner().prune(model, 0.5 * count_macs(model, x), x)
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)


# -- strategies through the CLI ------------------------------------------------------

FAST = ["--set", "finetune.epochs=1", "--set", "short_finetune.epochs=1", "--set", "scoring.subset=64",
        "--set", "finetune.subset=64", "--set", "short_finetune.subset=64", "--set", "scoring.batches=1"]


def _cli(trained_tiny, tmp_path, strategy, *extra):
    from hetprune.cli import main

    model, spec, ckpt = trained_tiny
    out = tmp_path / strategy
    rc = main(["prune", "--strategy", strategy, "--target-macs", "0.5", "--model", spec.name,
               "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt), "--out", str(out), *FAST, *extra])
    assert rc == 0
    return out, json.loads((out / "report.json").read_text())


REPORT_KEYS = {"metric_before_finetune", "metric", "top1_before_finetune", "top1", "seconds", "allocation", "removal",
               "merged", "finetune_history", "macs", "dense_macs", "params", "n_attn", "n_act", "sites", "strategy"}


@pytest.mark.slow
def test_isomorphic_strategy_cli(trained_tiny, tmp_path):
    out, report = _cli(trained_tiny, tmp_path, "isomorphic")
    assert REPORT_KEYS <= set(report)
    assert report["n_attn"] == report["n_act"] == 0 and report["merged"] == []
    target = 0.5 * report["dense_macs"]
    assert target * (1 - TOL) <= report["macs"] <= target and report["allocation"]["within_tolerance"]
    loaded = hetprune.load(out)
    x = tiny_example()
    recipe = hetprune.model.recipe.load_recipe(out)
    assert recipe.widths == read_widths(loaded) and recipe.provenance["strategy"] == "isomorphic"
    assert count_macs(loaded, x) == report["macs"]


@pytest.mark.slow
@pytest.mark.parametrize("order", ["auto", "depth-width", "width-depth", "interleaved"])
def test_hetdpt_plus_strategy_cli(trained_tiny, tmp_path, order):
    # a round of interleaved has a small cut with two frontier points on this tiny model: the dense point
    # makes a third, so the degree-1 fit has its three
    dense_point = "true" if order == "interleaved" else "false"
    out, report = _cli(trained_tiny, tmp_path, "hetdpt-plus", "--scorer", "taylor",
                       "--set", f"hetdpt_plus.order={order}", "--set", "hetdpt.axis_points=1",
                       "--set", "hetdpt.mixed_points=1", "--set", f"hetdpt.dense_point={dense_point}",
                       "--set", "hetdpt.predictor=poly", "--set", "hetdpt.predictor_options={poly: {degree: 1}}")
    assert REPORT_KEYS <= set(report)
    assert report["n_attn"] + report["n_act"] >= 1  # depth took its share...
    target = 0.5 * report["dense_macs"]
    assert target * (1 - TOL) <= report["macs"] <= target  # ...and width landed the total
    # auto: width first with a MAC budget (the order measured best)
    assert report["allocation"]["order"] == ("width-depth" if order == "auto" else order)
    assert report["allocation"]["within_tolerance"]
    assert report["top1"] == report["metric"] and report["metric_name"] == "top1"
    assert isinstance(report["allocation"]["depth"]["metric"], float)   # the depth step's own result, by the task
    recipe = hetprune.model.recipe.load_recipe(out)
    if order == "interleaved":   # two rounds, each removing sites and then pruning widths
        rounds = report["allocation"]["depth_rounds"]
        assert len(rounds) == 2 and all(r["sites"] for r in rounds)
        assert sorted(s for r in rounds for s in r["sites"]) == sorted(report["sites"])
        widths = report["allocation"]["width"]
        assert len(widths) == 2 and widths[0]["macs"] > widths[1]["macs"] == report["macs"]
    loaded = hetprune.load(out)
    for b in recipe.act_removed:  # merged exactly where it pays
        mlp = loaded.blocks[b].mlp
        assert (b in recipe.merged) == (isinstance(mlp, surgery.MergedMlp))
        if b not in recipe.merged:
            assert not surgery.merge_pays(mlp)
    assert recipe.widths == read_widths(loaded) and attention_problems(loaded) == []


NO_TRAINING = ["--set", "finetune.epochs=0", "--set", "short_finetune.epochs=0"]

DINOV2_SWIGLU = ModelSpec("vit_giant_patch14_reg4_dinov2", dict(   # timm's DINOv2 with a packed SwiGLU MLP
    img_size=16, in_chans=1, num_classes=10, patch_size=4, embed_dim=32, depth=3, num_heads=2, init_values=0.1))


@pytest.fixture(scope="module")
def dinov2_checkpoint(tmp_path_factory):
    from hetprune.core.io import save_weights

    torch.manual_seed(0)
    model = build(DINOV2_SWIGLU)
    assert isinstance(model.blocks[0].mlp, GluMlp) and not model.blocks[0].mlp.gate_last
    with torch.no_grad():   # gates that matter (timm starts them near a constant)
        for p in model.parameters():
            p.normal_(0, 0.2)
    path = tmp_path_factory.mktemp("dinov2") / "dinov2.safetensors"
    save_weights(path, model)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [
    ("isomorphic", []),
    ("hetdpt-plus", ["--scorer", "magnitude", "--set", "hetdpt_plus.intermediate_finetune=none",
                     "--set", "hetdpt.axis_points=1", "--set", "hetdpt.mixed_points=1",
                     "--set", "hetdpt.dense_point=true", "--set", "hetdpt.predictor=poly",
                     "--set", "hetdpt.predictor_options={poly: {degree: 1}}"]),
])
def test_dinov2_swiglu_width_strategies_save_a_model_that_reloads(dinov2_checkpoint, tmp_path, strategy, extra):
    """DINOv2's packed SwiGLU through the strategies: the saved recipe records the gated widths, the folder
    reloads, and the recipe applied to the base weights (hetprune apply) gives the saved model's function."""
    from hetprune.cli import main

    kwargs = json.dumps(DINOV2_SWIGLU.kwargs)
    model_args = ["--model", DINOV2_SWIGLU.name, "--model-kwargs", kwargs, "--checkpoint", str(dinov2_checkpoint)]
    out = tmp_path / "out"
    assert main(["prune", "--strategy", strategy, "--target-macs", "0.5", *model_args, "--out", str(out),
                 *FAST, *NO_TRAINING, *extra]) == 0
    report = json.loads((out / "report.json").read_text())
    target = 0.5 * report["dense_macs"]
    assert target * (1 - TOL) <= report["macs"] <= target
    loaded = hetprune.load(out)
    recipe = hetprune.model.recipe.load_recipe(out)
    assert recipe.widths == read_widths(loaded)
    gated = 0
    for block, entry in zip(loaded.blocks, recipe.widths["blocks"]):
        if isinstance(block.mlp, GluMlp):
            gated += 1
            assert block.mlp.fc1.out_features == 2 * entry["mlp"]["hidden"] == 2 * block.mlp.fc2.in_features
            assert entry["mlp"]["hidden"] < build(DINOV2_SWIGLU).blocks[0].mlp.fc2.in_features
    assert gated >= 1
    applied = tmp_path / "applied"
    assert main(["apply", *model_args, "--recipe", str(out / "recipe.json"), "--out", str(applied)]) == 0
    x = tiny_example()
    assert torch.allclose(hetprune.load(applied)(x), loaded(x), atol=1e-5)
    assert count_macs(loaded, x) == report["macs"]



@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [
    ("isomorphic", []),
    ("hetdpt-plus", ["--set", "hetdpt_plus.order=depth-width"]),
    ("hetdpt-plus", ["--set", "hetdpt_plus.order=width-depth"]),
    ("hetdpt-plus", ["--set", "hetdpt_plus.order=interleaved", "--set", "hetdpt.dense_point=true"]),
])
def test_width_recipe_applied_to_the_base_weights_reproduces_the_pruned_model(trained_tiny, tmp_path, strategy,
                                                                              extra):
    """With no training, the pruned model is a selection of the base weights: the recipe's kept channels
    applied to those weights (hetprune apply) must give the same function, not the leading channels'."""
    from hetprune.cli import main

    plus = ["--scorer", "magnitude", "--set", "hetdpt_plus.intermediate_finetune=none", "--set", "hetdpt.axis_points=1", "--set", "hetdpt.mixed_points=1",
            "--set", "hetdpt.dense_point=false", "--set", "hetdpt.predictor=poly", "--set", "hetdpt.predictor_options={poly: {degree: 1}}"]
    out, _ = _cli(trained_tiny, tmp_path, strategy, *NO_TRAINING, *(plus if strategy != "isomorphic" else []),
                  *extra)
    recipe = hetprune.model.recipe.load_recipe(out)
    kept = recipe.widths["kept"]
    assert kept["embed"] is not None and len(kept["embed"]) == recipe.widths["embed_dim"]
    assert kept["embed"] != list(range(recipe.widths["embed_dim"])) or any(
        b != "dropped" and b["mlp"] is not None and b["mlp"] != list(range(len(b["mlp"]))) for b in kept["blocks"])
    _, spec, ckpt = trained_tiny
    applied = tmp_path / "applied"
    assert main(["apply", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
                 "--recipe", str(out / "recipe.json"), "--out", str(applied)]) == 0
    x = tiny_example()
    assert torch.allclose(hetprune.load(applied)(x), hetprune.load(out)(x), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("round_to", [4, 16])
def test_round_to_keeps_every_pruned_width_a_multiple(trained_tiny, tmp_path, round_to):
    out, report = _cli(trained_tiny, tmp_path, "isomorphic", "--round-to", str(round_to))
    widths = hetprune.model.recipe.load_recipe(out).widths
    assert widths["embed_dim"] % round_to == 0 and widths["embed_dim"] < 32
    for block in widths["blocks"]:
        assert block["mlp"]["hidden"] % round_to == 0
        assert (block["attn"]["heads"] * block["attn"]["head_dim"]) % round_to == 0
    assert report["settings"]["width"]["pruner_options"]["round_to"] == round_to
    assert report["macs"] <= 0.5 * report["dense_macs"]


def test_round_to_is_refused_for_a_strategy_without_widths(trained_tiny, tmp_path, capsys):
    from hetprune.cli import main

    _, spec, ckpt = trained_tiny
    assert main(["prune", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
                 "--strategy", "act-only", "--budget", "2", "--round-to", "8", "--out", str(tmp_path / "o")]) == 2
    assert "--round-to applies to width strategies" in capsys.readouterr().err


def test_share_search_picks_the_best_split_of_a_known_surface_and_the_result_reloads(trained_tiny, tmp_path,
                                                                                      monkeypatch):
    """Points come from a known surface (peak at an interior split, one attention + one activation site):
    the search must plan points only among splits whose depth alone stays above the target, fit them,
    pick the peak, prune exactly that split, and land the MAC target with widths; the result reloads."""
    from hetprune_width import share_search
    from hetprune.pruning.budget import kind_savings, pair_cost
    from hetprune.model.sites import depth

    def surface(a, m):
        return 80.0 - 3.0 * (a - 1) ** 2 - 2.0 * (m - 1) ** 2

    measured_plans = []

    def fake_measure(job, depth_strategy, plan, target, width_prune):
        measured_plans.append(list(plan))
        return [{"n_attn": a, "n_act": m, "metric": surface(a, m)} for a, m in plan]

    monkeypatch.setattr(share_search, "measure", fake_measure)
    out, report = _cli(trained_tiny, tmp_path, "hetdpt-plus", "--scorer", "magnitude",   # a quadratic: poly fits it
                       "--set", "hetdpt_plus.depth_share=search", "--set", "hetdpt.predictor=poly", *NO_TRAINING)
    info = report["allocation"]["share_search"]
    assert info["pick"]["n_attn"] == 1 and info["pick"]["n_act"] == 1
    assert (report["n_attn"], report["n_act"]) == (1, 1)        # the depth step removed exactly the pick
    target = 0.5 * report["dense_macs"]
    assert target * (1 - TOL) <= report["macs"] <= target     # width pruning took the rest of the cut
    model, spec, _ = trained_tiny
    x = tiny_example()
    macs = pair_cost(kind_savings(model, x), depth(model))
    for a, m in info["candidates"]:                           # depth alone never overshoots the target
        assert macs(a, m) >= target
    assert (0, 0) in {tuple(p) for p in measured_plans[0]} and 0 < info["depth_share"] < 1
    assert info["fit"]["mae"] == pytest.approx(0, abs=1e-6)   # poly degree 2 fits the quadratic exactly
    loaded = hetprune.load(out)
    assert count_macs(loaded, x) == report["macs"]


def test_share_search_refuses_what_it_cannot_do(trained_tiny, tmp_path, capsys):
    from hetprune.cli import main

    model, spec, ckpt = trained_tiny
    base = ["prune", "--strategy", "hetdpt-plus", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs),
            "--checkpoint", str(ckpt), "--set", "hetdpt_plus.depth_share=search", *NO_TRAINING]
    assert main([*base, "--target-macs", "0.5", "--set", "hetdpt_plus.order=width-depth",
                 "--out", str(tmp_path / "a")]) == 2
    assert "search runs with order depth-width" in capsys.readouterr().err
    assert main([*base, "--target-macs", "0.5", "--set", "hetdpt_plus.depth_share=lots",
                 "--out", str(tmp_path / "b")]) == 2
    assert "within (0, 1) or 'search'" in capsys.readouterr().err


@pytest.mark.parametrize("setting, message", [
    (["hetdpt_plus.order=sideways"], "must be one of auto, depth-width, width-depth, interleaved"),
    (["hetdpt_plus.order=interleaved", "hetdpt_plus.rounds=0"], "rounds must be a whole number >= 1"),
    (["hetdpt_plus.order=interleaved", "hetdpt_plus.depth_sites=1"], "cannot be spread over hetdpt_plus.rounds 2"),
    (["hetdpt_plus.order=interleaved"], "use --target-macs for interleaved"),   # with a time budget below
])
def test_hetdpt_plus_order_settings_are_checked(trained_tiny, tmp_path, capsys, setting, message):
    from hetprune.cli import main

    model, spec, ckpt = trained_tiny
    budget = (["--target-speedup", "1.5", "--cost-model", "latency"] if message.startswith("use --target-macs")
              else ["--target-macs", "0.5"])
    assert main(["prune", "--strategy", "hetdpt-plus", "--model", spec.name, "--model-kwargs",
                 json.dumps(spec.kwargs), "--checkpoint", str(ckpt), *budget, *NO_TRAINING,
                 *(a for s in setting for a in ("--set", s)), "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_hetdpt_plus_reports_the_tasks_own_metric_for_its_depth_step_and_the_whole(trained_tiny, digits_data):
    """A user Task's metric (here "acc", not top-1) is what hetdpt-plus reports, for the whole run and for its
    depth step, and what its log says (a report written under top-1 keys lost the depth step's value)."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Subset

    from hetprune.training.task import Task

    model, spec, _ = trained_tiny

    @torch.no_grad()
    def acc(net, val):
        return 100.0 * sum(int((net(x).argmax(-1) == y).sum()) for x, y in val) / 32

    task = Task(DataLoader(Subset(digits_data.train, range(32)), batch_size=16),
                DataLoader(Subset(digits_data.val, range(32)), batch_size=16),
                lambda net, b: F.cross_entropy(net(b[0]), b[1]), acc, metric_name="acc", name="width-task")
    logged = []
    settings = {"finetune": {"epochs": 1, "subset": 32, "batch_size": 16},
                "short_finetune": {"epochs": 1, "subset": 32, "batch_size": 16}, "scoring": {"batches": 1},
                "hetdpt": {"axis_points": 1, "mixed_points": 1, "predictor": "poly",
                           "predictor_options": {"poly": {"degree": 1}}}}
    result = hetprune.prune(model, task, strategy="hetdpt-plus", target_macs=0.5, spec=spec, progress=False,
                            log=logged.append, settings=settings)
    report = result.report
    assert report["metric_name"] == "acc" and not any(k.startswith("top1") for k in report)
    assert report["metric"] == pytest.approx(acc(result.model.eval(), task.val))
    assert isinstance(report["allocation"]["depth"]["metric"], float)
    assert any(line.startswith("[hetdpt-plus] acc ") and "after depth + width pruning" in line for line in logged)


def test_a_report_without_the_dense_metric_takes_it_from_the_base_info():
    """Width strategies leave ``metric_dense`` to the shared report: the embedded base's info holds its top-1
    under ``top1`` (what the shipped weights' index records), and the report must still name it."""
    from types import SimpleNamespace

    from hetprune.pruning.pipeline import metric_entries

    job = SimpleNamespace(task=SimpleNamespace(metric_name="top1", higher_is_better=True),
                          base_info={"top1": 98.89})
    out = metric_entries(job, {"metric": 90.0, "metric_before_finetune": 80.0})
    assert out["metric_dense"] == out["top1_dense"] == 98.89 and out["top1"] == 90.0


def test_share_search_picks_the_lowest_predicted_split_when_the_metric_is_better_lower(trained_tiny, digits_data,
                                                                                      monkeypatch):
    """Issue 34, item 3: the search took max(...) whatever the metric's direction: the worst split of a loss."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Subset

    from hetprune_width import share_search
    from hetprune.harness.testing import TINY_SETTINGS

    def fake_measure(job, depth_strategy, plan, target, width_prune):
        return [{"n_attn": a, "n_act": m, "metric": 0.5 + 0.3 * (a - 1) ** 2 + 0.2 * (m - 1) ** 2}
                for a, m in plan]

    monkeypatch.setattr(share_search, "measure", fake_measure)

    def loss(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1])

    def mean_loss(model, val):
        return sum(float(loss(model, b)) for b in val) / len(val)

    batches = DataLoader(Subset(digits_data.train, range(32)), batch_size=16)
    task = hetprune.Task(train=batches, val=batches, loss=loss, metric=mean_loss, higher_is_better=False)
    result = hetprune.prune(trained_tiny[0], task, strategy="hetdpt-plus", target_macs=0.5, progress=False,
                            log=lambda m: None, settings={**TINY_SETTINGS, "scorer": "magnitude", "hetdpt": {
                                "predictor": "poly"}, "hetdpt_plus": {"depth_share": "search"},
                                "finetune": {"epochs": 0}, "short_finetune": {"epochs": 0}})
    pick = result.report["allocation"]["share_search"]["pick"]
    assert (pick["n_attn"], pick["n_act"]) == (1, 1)
