"""Every model family an adapter supports: removal exact against a functional
reference (fp32 and fp64), merge exact, save/reload bit-identical, MACs equal to
FlopCounterMode's count, and the commands end to end on a tiny model of each."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import hetprune
from hetprune import HetpruneError, Site
from hetprune.model import surgery
from hetprune.model.adapters import adapter_for
from hetprune.cli import main
from hetprune.model.macs import count_macs
from hetprune.model.spec import input_shape_of
from hetprune.model.recipe import apply_recipe, arch_of, recipe_from_model
from families import FAMILIES, attn_mode, cli_name, example, make, spec

KEYS = sorted(FAMILIES)
TOL = {torch.float32: 2e-5, torch.float64: 1e-11}


def removal_plan(model) -> list[Site]:
    """Both sites of block 0, the activation of block 1, the attention of the last block."""
    last = len(adapter_for(model).block_slots(model)) - 1
    return [Site(0, "attn"), Site(0, "act"), Site(1, "act"), Site(last, "attn")]


def remove(model, plan, mode="identity"):
    for site in plan:
        if site.kind == "attn":
            surgery.remove_attention(model, site.block, mode)
        else:
            surgery.remove_activation(model, site.block)
    return model


def rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max()) if not a.requires_grad else rel_err(a.detach(), b.detach())


@pytest.mark.parametrize("key", KEYS)
def test_the_family_is_served_by_its_adapter_with_two_sites_per_block(key):
    model = make(key)
    adapter = adapter_for(model)
    assert adapter.name == FAMILIES[key][0]
    n = len(adapter.block_slots(model))
    assert hetprune.sites(model) == [Site(i, k) for i in range(n) for k in ("attn", "act")]


@pytest.mark.parametrize("key", KEYS)
def test_the_input_shape_is_the_one_the_model_was_built_for(key):
    """Every family is built for 1 x 16 x 16 digits, whatever timm's pretrained config says (a NaFlexViT keeps
    no img_size of its own: it said (3, 384, 384), and examples, data transforms and exports used that)."""
    model = make(key)
    assert input_shape_of(model) == (1, 16, 16)
    assert model(torch.randn(2, *input_shape_of(model))).shape == (2, 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("key", KEYS)
def test_removal_equals_the_functional_reference(key, dtype):
    """Attention branch -> zeros, activation -> identity (a gate -> 1): real surgery computes the same."""
    model, x = make(key, dtype), example(dtype=dtype)
    plan = removal_plan(model)
    dense = model(x)
    with surgery.functional_reference(model, plan, attn_mode(key)):
        reference = model(x)
    assert rel_err(dense, reference) > 1e-3  # the plan changes the function: the comparison means something
    pruned = remove(copy.deepcopy(model), plan, attn_mode(key))
    assert {surgery.attn_mode_of(pruned, s.block) for s in plan if s.kind == "attn"} == {attn_mode(key)}
    assert rel_err(pruned(x), reference) < TOL[dtype]
    assert [s for s in plan if not surgery.site_removed(pruned, s)] == []
    assert len(hetprune.sites(pruned)) == len(hetprune.sites(model)) - len(plan)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("key", KEYS)
def test_merge_is_exact_and_only_where_the_mlp_is_linear(key, dtype):
    model, x = make(key, dtype), example(dtype=dtype)
    pruned = remove(copy.deepcopy(model), removal_plan(model), attn_mode(key))
    before = pruned(x)
    merged = surgery.merge_all(pruned, fold_norm=True)
    has_inner_norm = key.endswith("-norm")  # SwiGLU with a norm after the gate: fc2(norm(u(x))) is not linear
    assert sorted(merged) == ([] if has_inner_norm else [0, 1])
    assert rel_err(pruned(x), before) < TOL[dtype] * 10
    for b in merged:
        assert surgery.site_removed(pruned, Site(b, "act")) and adapter_for(pruned).is_merged(pruned, b)


@pytest.mark.parametrize("key", KEYS)
def test_saved_model_reloads_bit_identical_and_the_recipe_applies_to_the_same_weights(key, tmp_path):
    model, x = make(key), example()
    pruned = remove(copy.deepcopy(model), removal_plan(model), attn_mode(key))
    surgery.merge_all(pruned)
    recipe = recipe_from_model(pruned, spec(key), arch_of(model))
    assert recipe.adapter == FAMILIES[key][0]
    hetprune.save(tmp_path / "m", pruned, recipe)
    loaded = hetprune.load(tmp_path / "m")
    assert torch.equal(loaded(x), pruned(x))
    assert input_shape_of(loaded) == input_shape_of(model)  # the rebuilt base keeps its kwargs' shape
    replayed = apply_recipe(copy.deepcopy(model), recipe)
    assert rel_err(replayed(x), pruned(x)) < 1e-5


def flop_counter_macs(model, x) -> float:
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:  # (under no_grad its module tracker fails on CaiT)
        model(x)
    return counter.get_total_flops() / 2 / x.shape[0]


@pytest.mark.parametrize("key", KEYS)
def test_macs_equal_the_flop_counter_dense_and_pruned(key):
    """FlopCounterMode sees every matmul under the math SDPA backend (windows, class attention included)."""
    model, x = make(key), example(2)
    pruned = remove(copy.deepcopy(model), removal_plan(model), attn_mode(key))
    surgery.merge_all(pruned)
    dense_macs, pruned_macs = count_macs(model, x), count_macs(pruned, x)
    assert dense_macs == flop_counter_macs(model, x)
    assert pruned_macs == flop_counter_macs(pruned, x)
    assert pruned_macs < dense_macs


def test_swin_sites_are_numbered_across_stages():
    model = make("swin")
    assert [len(s.blocks) for s in model.layers] == [2, 2]
    surgery.remove_attention(model, 2)  # stage 1's first block
    assert isinstance(model.layers[1].blocks[0], surgery.HetBlock)
    assert not isinstance(model.layers[0].blocks[0], surgery.HetBlock)


def test_cait_class_attention_blocks_are_not_sites_and_every_self_attention_may_go():
    model, x = make("cait"), example()
    assert len(hetprune.sites(model, "attn")) == len(model.blocks)
    for b in range(len(model.blocks)):
        surgery.remove_attention(model, b)
    out = model(x)
    assert out.std(dim=0).max() > 1e-4  # class attention still sees the patches: not a constant output
    assert len(hetprune.sites(model)) == len(model.blocks)  # the activations


def test_gated_mlp_activation_removal_removes_the_gate():
    model = make("eva02-swiglu")
    surgery.remove_activation(model, 0)
    mlp = model.blocks[0].mlp
    assert isinstance(mlp, surgery.LinearMlp) and surgery.mergeable(model, 0)
    norm_model = make("eva02-swiglu-norm")
    surgery.remove_activation(norm_model, 0)
    assert not surgery.mergeable(norm_model, 0)
    with pytest.raises(HetpruneError, match="norm between fc1 and fc2"):
        surgery.merge_mlp(norm_model, 0)


def test_width_pruning_of_a_family_without_width_support_is_a_clear_error():
    from hetprune.model.widths import read_widths

    with pytest.raises(HetpruneError, match="width pruning is not supported for the timm-swin family"):
        read_widths(make("swin"))


def test_hf_adapter_lives_outside_the_core_and_uses_only_public_api():
    import ast
    import pathlib

    import hetprune_hf

    public = {"hetprune", "hetprune.plugin_api"}   # the plugin surface (tests/test_plugin_api.py: every plugin)
    for path in pathlib.Path(hetprune_hf.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hetprune"):
                assert node.module in public, f"{path.name} imports {node.module}"
    assert "hetprune_hf" not in {p.name for p in pathlib.Path(hetprune.__file__).parent.iterdir()}


def test_recipe_for_another_family_is_refused(tmp_path):
    pruned = remove(make("vit"), [Site(0, "act")])
    recipe = recipe_from_model(pruned, spec("vit"), arch_of(make("vit")))
    with pytest.raises(HetpruneError, match="made with the timm-vit adapter, but this model .* timm-beit"):
        apply_recipe(make("beit"), recipe)


# -- the commands on every family -------------------------------------------------------------
FAST = ["--scorer", "magnitude", "--set", "finetune.epochs=1", "--set", "finetune.subset=32",
        "--set", "scoring.subset=32", "--set", "scoring.batches=1"]


@pytest.fixture
def checkpoint(tmp_path):
    def write(key):
        from hetprune.core.io import save_weights

        path = tmp_path / f"{key}.safetensors"
        save_weights(path, make(key))
        return ["--model", cli_name(key), "--model-kwargs", json.dumps(spec(key).kwargs), "--checkpoint", str(path)]

    return write


@pytest.mark.slow
@pytest.mark.parametrize("key", ["cait", "beit", "eva02-swiglu", "vit-rope", "relpos", "swin", "dinov2-reg-swiglu",
                                 "hf-vit"])
def test_prune_apply_and_bench_run_on_every_family(key, checkpoint, tmp_path, capsys):
    model_args = checkpoint(key)
    out = tmp_path / "pruned"
    assert main(["prune", *model_args, "--strategy", "mix50", "--budget", "2", "--out", str(out), *FAST]) == 0
    loaded = hetprune.load(out)
    report = json.loads((out / "report.json").read_text())
    assert report["n_attn"] == 1 and report["n_act"] == 1 and report["macs"] < report["dense_macs"]
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["adapter"] == FAMILIES[key][0]
    assert loaded(example()).shape == (3, 10)
    applied = tmp_path / "applied"
    capsys.readouterr()
    assert main(["apply", *model_args, "--recipe", str(out / "recipe.json"), "--out", str(applied)]) == 0
    assert "note: not fine-tuned" in capsys.readouterr().out
    assert hetprune.model.recipe.load_recipe(applied).provenance["fine_tuned"] is False
    again = tmp_path / "applied-from-recipe-base"  # no --model: the recipe's own base (hf-vit:... included)
    assert main(["apply", "--checkpoint", model_args[-1], "--recipe", str(out / "recipe.json"),
                 "--out", str(again)]) == 0
    assert hetprune.model.recipe.load_recipe(applied).removed_sites == hetprune.model.recipe.load_recipe(out).removed_sites
    assert main(["bench", str(out), "--batch-sizes", "2", "--repeats", "2", "--warmup", "1", "--min-time", "0.01",
                 "--device", "cpu"]) == 0
    assert "speedup" in capsys.readouterr().out.lower()


@pytest.mark.slow
@pytest.mark.parametrize("key", ["swin", "hf-vit"])
def test_compare_and_ablate_run_on_families_beyond_the_timm_vit(key, checkpoint, tmp_path):
    model_args = checkpoint(key)
    out = tmp_path / "cmp"
    assert main(["compare", *model_args, "--speed-budget", "0",
                 "--strategies", "attn-only,act-only", "--budgets", "2", "--seeds", "0",
                 "--batch-sizes", "1", "--out", str(out), *FAST]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["strategy"], r["n_attn"], r["n_act"]) for r in rows} == {("attn-only", 2, 0), ("act-only", 0, 2)}
    abl = tmp_path / "abl"
    assert main(["ablate", *model_args, "--budget", "1", "--seeds", "0", "--scorers", "magnitude",
                 "--predictors", "poly", "--out", str(abl), *FAST,
                 "--set", "hetdpt.predictor_options={poly: {degree: 1}}"]) == 0
    splits = {(s["n_attn"], s["n_act"]) for s in json.loads((abl / "ablation.json").read_text())["splits"]}
    assert splits == {(0, 1), (1, 0)}


# -- the conformance kit on adapters ----------------------------------------------------------------------
def _broken_adapters():
    from hetprune.model.block_modules import BlockLayout
    from hetprune_timm.vit import TimmViT

    class Undercounts(TimmViT):
        name = "undercounting-vit"

        def attention_macs(self, module, inputs):
            return 0

    class ForgetsLayerScale(TimmViT):
        name = "no-layerscale-vit"
        layout = BlockLayout(mlp_scale=None)  # the kept MLP branch loses ls2 when attention is removed

    class MatchesNothing(TimmViT):
        name = "blind-vit"

        def matches(self, model):
            return False

    return [(Undercounts, "FlopCounterMode"), (ForgetsLayerScale, "differs from the functional reference"),
            (MatchesNothing, "matches\\(\\) is False")]


@pytest.mark.parametrize("index", range(3))
def test_the_kit_catches_a_broken_adapter_and_says_which_rule(index, monkeypatch):
    from hetprune.core import plugins
    from hetprune.harness import testing

    monkeypatch.setenv("HETPRUNE_PLUGINS", "hetdpt,baselines,width")  # no built-in adapter claims the model
    plugins.reset()
    try:
        broken, rule = _broken_adapters()[index]
        with pytest.raises(testing.ConformanceError, match=rule):
            testing.check_architecture(broken)
    finally:
        monkeypatch.delenv("HETPRUNE_PLUGINS")
        plugins.reset()


def test_the_kit_reports_an_adapter_whose_example_cannot_be_built(monkeypatch):
    """A missing optional library (say transformers for hf-vit) is one FAIL line for that adapter, not a crash."""
    from hetprune.harness import testing
    from hetprune_timm.vit import TimmViT

    def missing():
        raise HetpruneError("needs mylib: pip install 'hetprune[mylib]'")

    with pytest.raises(testing.ConformanceError, match="cannot build its example model: needs mylib"):
        testing.check_architecture(TimmViT, make_model=missing)
