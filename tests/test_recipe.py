"""Issue 2, point 7: recipes, pruned models on disk, ``hetprune apply``, and bad input.

A recipe is plain JSON with a schema version; a saved model is recipe.json +
model.safetensors, rebuilt by replaying the recipe on a fresh base model;
nothing is unpickled; bad input is one clear error and leaves nothing
half-written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import timm
import torch
from safetensors import safe_open

import hetprune
from hetprune import HetpruneError, Recipe
from hetprune.model import surgery
from hetprune.cli import main
from hetprune.model.macs import count_macs, count_params
from hetprune.core.io import load_weights, save_weights
from hetprune.model.spec import ModelSpec, build
from hetprune.model.recipe import (RECIPE_FILE, SCHEMA_VERSION, WEIGHTS_FILE, apply_recipe, arch_of,
                                   recipe_from_model, resolve_recipe, shipped_recipes)
from conftest import TINY_KWARGS, tiny_example

MODEL = "vit_tiny_patch16_224"


def make_recipe(spec, **changes) -> Recipe:
    torch.manual_seed(0)
    fields = dict(base=spec, arch=arch_of(build(spec)), attn_removed=[1], act_removed=[0, 2], merged=[0, 2],
                  adapter="timm-vit")
    fields.update(changes)
    return Recipe(**fields)


def pruned_model(spec, recipe, seed=0):
    torch.manual_seed(seed)
    model = build(spec)
    with torch.no_grad():  # non-trivial affines, so a wrong fold would show
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return apply_recipe(model, recipe).eval()


def folder_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


VARIANTS = {
    "identity-merged": {},
    "ln-residual-folded": dict(attn_mode="ln-residual", fold_norm=True, attn_removed=[0, 3], act_removed=[1, 2, 3],
                               merged=[1, 3]),
    "dropped-block": dict(attn_removed=[0], act_removed=[1], merged=[], dropped=[3]),
    "dense": dict(attn_removed=[], act_removed=[], merged=[]),
}


# -- the JSON ------------------------------------------------------------------------------------

def test_recipe_is_plain_json_with_a_schema_version(tiny_spec, tmp_path):
    recipe = make_recipe(tiny_spec, provenance={"strategy": "hand"})
    d = recipe.to_dict()
    assert list(d)[0] == "schema" and d["schema"] == SCHEMA_VERSION == 1
    assert d["base"] == {"name": MODEL, "kwargs": TINY_KWARGS}
    assert d["arch"] == {"depth": 4, "embed_dim": 32, "num_heads": 2, "mlp_hidden": 128}
    path = tmp_path / "r.json"
    recipe.write(path)
    assert json.loads(path.read_text()) == d  # human-readable JSON, nothing else
    assert Recipe.read(path) == recipe
    assert recipe.n_attn == 1 and recipe.n_act == 2
    assert [str(s) for s in recipe.removed_sites] == ["attn1", "act0", "act2"]


def test_recipe_read_back_from_a_pruned_model(tiny_spec):
    for key, changes in VARIANTS.items():
        recipe = make_recipe(tiny_spec, **changes)
        model = pruned_model(tiny_spec, recipe)
        back = recipe_from_model(model, tiny_spec, recipe.arch, fold_norm=recipe.fold_norm)
        assert {k: v for k, v in back.to_dict().items() if k != "provenance"} == \
               {k: v for k, v in recipe.to_dict().items() if k != "provenance"}, key
        assert set(back.provenance["versions"]) >= {"hetprune", "torch", "timm"}


BAD_RECIPES = {
    "not an object": ([1, 2], "is not a JSON object"),
    "old schema": ({"schema": 0}, "has schema 0; this hetprune reads schema 1"),
    "no schema": ({"base": {}}, "has schema None"),
    "unknown key": ({"schema": 1, "base": {"name": "x"}, "arch": {}, "heads_removed": []}, "unknown key(s) heads_removed"),
    "missing arch": ({"schema": 1, "base": {"name": "x"}}, "is missing 'arch'"),
    "arch not an object": ({"schema": 1, "base": {"name": "x"}, "arch": [12]}, "'arch' must be a JSON object"),
    "base without name": ({"schema": 1, "base": {"kwargs": {}}, "arch": {}}, "needs a string 'name'"),
    "kwargs not an object": ({"schema": 1, "base": {"name": "x", "kwargs": "big"}, "arch": {}}, "'kwargs' must be"),
    "indices not ints": ({"schema": 1, "base": {"name": "x"}, "arch": {}, "attn_removed": ["3"]},
                         "'attn_removed' must be a list of block indices"),
    "bool index": ({"schema": 1, "base": {"name": "x"}, "arch": {}, "merged": [True]}, "'merged' must be a list"),
    "bad attn mode": ({"schema": 1, "base": {"name": "x"}, "arch": {}, "attn_mode": "zero"}, "attn_mode must be one of"),
    "fold_norm not bool": ({"schema": 1, "base": {"name": "x"}, "arch": {}, "fold_norm": "yes"}, "'fold_norm' must be"),
}


@pytest.mark.parametrize("key", sorted(BAD_RECIPES))
def test_malformed_recipe_is_a_clear_error(tmp_path, key):
    data, message = BAD_RECIPES[key]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HetpruneError) as err:
        Recipe.read(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_truncated_or_garbled_recipe_file(tiny_spec, tmp_path):
    path = tmp_path / "r.json"
    make_recipe(tiny_spec).write(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(HetpruneError, match="is malformed or truncated"):
        Recipe.read(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(HetpruneError, match="is malformed or truncated"):
        Recipe.read(path)
    with pytest.raises(HetpruneError, match="does not exist"):
        Recipe.read(tmp_path / "missing.json")


# -- fitting a recipe to a model -------------------------------------------------------------------

def test_recipe_for_another_model_is_refused(tiny_spec, tiny_model):
    for key, want in (("depth", 6), ("embed_dim", 64), ("num_heads", 4), ("mlp_hidden", 96)):
        recipe = make_recipe(tiny_spec)
        recipe.arch[key] = want
        with pytest.raises(HetpruneError, match=f"made for a model with {key}={want}, but this model has {key}="):
            apply_recipe(tiny_model, recipe)
    assert hetprune.sites(tiny_model) == hetprune.sites(tiny_model, present_only=False)  # untouched


@pytest.mark.parametrize("changes, message", [
    (dict(attn_removed=[4]), r"attn_removed has block indices \[4\] out of range: the model has blocks 0\.\.3"),
    (dict(act_removed=[-1], merged=[]), r"act_removed has block indices \[-1\] out of range"),
    (dict(dropped=[9]), r"dropped has block indices \[9\] out of range"),
    (dict(act_removed=[2, 2], merged=[]), "lists a block twice"),
    (dict(merged=[0, 1]), r"merges blocks \[1\] whose activation is not removed"),
    (dict(dropped=[1]), r"drops blocks \[1\] and also lists their sites"),
    (dict(attn_removed=[0, 1, 2, 3]), "every attention site of a class-token model"),
])
def test_recipe_with_bad_indices_is_refused_before_any_change(tiny_spec, tiny_model, changes, message):
    with pytest.raises(HetpruneError, match=message):
        apply_recipe(tiny_model, make_recipe(tiny_spec, **changes))
    assert hetprune.sites(tiny_model) == hetprune.sites(tiny_model, present_only=False)


def test_all_attention_may_go_without_a_class_token():
    spec = ModelSpec(MODEL, {**TINY_KWARGS, "class_token": False, "global_pool": "avg"})
    model = pruned_model(spec, make_recipe(spec, attn_removed=[0, 1, 2, 3]))
    assert hetprune.sites(model, "attn") == []


def test_recipe_is_applied_to_unpruned_models_only(tiny_spec, tiny_model):
    recipe = make_recipe(tiny_spec)
    apply_recipe(tiny_model, recipe)
    with pytest.raises(HetpruneError, match="has lost act0, attn1, act2 already; build a fresh base model"):
        apply_recipe(tiny_model, recipe)


# -- save / load -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(VARIANTS))
def test_save_then_load_gives_identical_outputs(tiny_spec, tmp_path, key):
    recipe = make_recipe(tiny_spec, **VARIANTS[key])
    model = pruned_model(tiny_spec, recipe)
    out = hetprune.save(tmp_path / "pruned", model, recipe)
    assert folder_files(out) == {RECIPE_FILE, WEIGHTS_FILE}
    assert leftovers(tmp_path) == []
    loaded = hetprune.load(out)
    assert not loaded.training
    x = tiny_example(5)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert [type(b).__name__ for b in loaded.blocks] == [type(b).__name__ for b in model.blocks]
    assert hetprune.model.recipe.load_recipe(out) == recipe


def test_saved_folder_holds_no_pickles(tiny_spec, tmp_path):
    recipe = make_recipe(tiny_spec)
    out = hetprune.save(tmp_path / "pruned", pruned_model(tiny_spec, recipe), recipe)
    json.loads((out / RECIPE_FILE).read_text(encoding="utf-8"))
    raw = (out / WEIGHTS_FILE).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])  # safetensors: a JSON header, then raw tensor bytes
    assert header["__metadata__"] == {"format": "hetprune", "schema": "1"}
    assert b"\x80\x04" not in raw[:2] and not raw.startswith(b"PK")  # neither a pickle nor a torch zip
    with safe_open(str(out / WEIGHTS_FILE), "pt") as f:
        assert set(f.keys()) == set(hetprune.load(out).state_dict())


class _Exploit:
    """Unpickling this would create a folder: the proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pth_with_a_pickled_object_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"w": torch.ones(2)}, "extra": _Exploit(str(marker))}, path)
    with pytest.raises(HetpruneError, match=r"cannot be read safely \(it is loaded with weights_only=True"):
        load_weights(path)
    assert not marker.exists()


def test_pth_with_non_tensor_values_is_refused(tmp_path):
    path = tmp_path / "odd.pth"
    torch.save({"w": torch.ones(2), "epoch": 3}, path)
    with pytest.raises(HetpruneError, match="holds no state dict of tensors"):
        load_weights(path)


def test_pth_state_dicts_load_with_their_usual_wrappers(tmp_path):
    state = {"a": torch.arange(3.0)}
    for wrapped in (state, {"model": state}, {"state_dict": {"module.a": state["a"]}, "epoch": 3}):
        torch.save(wrapped, tmp_path / "c.pth")
        got = load_weights(tmp_path / "c.pth")
        assert got.keys() == {"a"} and torch.equal(got["a"], state["a"])


def test_truncated_weights_file_is_a_clear_error(tiny_spec, tmp_path):
    recipe = make_recipe(tiny_spec)
    out = hetprune.save(tmp_path / "pruned", pruned_model(tiny_spec, recipe), recipe)
    weights = out / WEIGHTS_FILE
    raw = weights.read_bytes()
    for size in (len(raw) - 1, len(raw) // 2, 7, 0):
        weights.write_bytes(raw[:size])
        with pytest.raises(HetpruneError, match="is malformed or truncated"):
            hetprune.load(out)


def test_weights_of_another_recipe_are_refused(tiny_spec, tmp_path):
    a, b = make_recipe(tiny_spec), make_recipe(tiny_spec, attn_removed=[], act_removed=[], merged=[])
    out_a = hetprune.save(tmp_path / "a", pruned_model(tiny_spec, a), a)
    out_b = hetprune.save(tmp_path / "b", pruned_model(tiny_spec, b), b)
    (out_a / WEIGHTS_FILE).write_bytes((out_b / WEIGHTS_FILE).read_bytes())
    with pytest.raises(HetpruneError, match=r"does not fit this model: .*unexpected keys"):
        hetprune.load(out_a)


def test_load_of_something_that_is_not_a_saved_model(tmp_path):
    with pytest.raises(HetpruneError, match="is not a folder holding a pruned model"):
        hetprune.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HetpruneError, match="recipe file .* does not exist"):
        hetprune.load(tmp_path / "empty")


def test_output_folder_holding_a_different_result_is_refused_unless_overwrite(tiny_spec, tmp_path):
    a, b = make_recipe(tiny_spec), make_recipe(tiny_spec, attn_removed=[2])
    model_a, model_b = pruned_model(tiny_spec, a), pruned_model(tiny_spec, b)
    out = tmp_path / "pruned"
    hetprune.save(out, model_a, a)
    hetprune.save(out, model_a, make_recipe(tiny_spec, provenance={"note": "same result, new provenance"}))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(HetpruneError, match="already holds a different result; pass overwrite=True"):
        hetprune.save(out, model_b, b)
    assert hetprune.model.recipe.load_recipe(out).attn_removed == [1]
    with pytest.raises(HetpruneError, match="already holds a different result"):  # same recipe, other weights
        hetprune.save(out, pruned_model(tiny_spec, a, seed=1), a)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # refused: not a byte changed
    hetprune.save(out, model_b, b, overwrite=True)
    assert hetprune.model.recipe.load_recipe(out).attn_removed == [2]
    assert leftovers(tmp_path) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(HetpruneError, match="exists and is not a folder"):
        hetprune.save(tmp_path / "file", model_a, a)


def test_an_empty_output_folder_is_used(tiny_spec, tmp_path):
    (tmp_path / "pruned").mkdir()
    recipe = make_recipe(tiny_spec)
    hetprune.save(tmp_path / "pruned", pruned_model(tiny_spec, recipe), recipe)
    assert folder_files(tmp_path / "pruned") == {RECIPE_FILE, WEIGHTS_FILE}


@pytest.mark.parametrize("where", ["weights", "recipe"])
def test_interrupted_save_leaves_no_folder_that_looks_complete(tiny_spec, tmp_path, monkeypatch, where):
    recipe = make_recipe(tiny_spec)
    model = pruned_model(tiny_spec, recipe)
    if where == "weights":
        real = hetprune.model.recipe.save_weights

        def save_then_die(path, *args, **kwargs):
            real(path, *args, **kwargs)  # the file is complete ...
            raise KeyboardInterrupt  # ... and then the user presses Ctrl-C

        monkeypatch.setattr(hetprune.model.recipe, "save_weights", save_then_die)
    else:
        def die(self, path):
            Path(path).write_text('{"schema": 1, "ba')  # half a file, then the disk fills
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(Recipe, "write", die)
    with pytest.raises((KeyboardInterrupt, OSError)):
        hetprune.save(tmp_path / "pruned", model, recipe)
    assert not (tmp_path / "pruned").exists()
    assert leftovers(tmp_path) == []


def test_interrupted_overwrite_keeps_the_old_result(tiny_spec, tmp_path, monkeypatch):
    a, b = make_recipe(tiny_spec), make_recipe(tiny_spec, attn_removed=[2])
    model_a = pruned_model(tiny_spec, a)
    out = hetprune.save(tmp_path / "pruned", model_a, a)

    def die(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(hetprune.model.recipe, "save_weights", die)
    with pytest.raises(RuntimeError):
        hetprune.save(out, pruned_model(tiny_spec, b), b, overwrite=True)
    monkeypatch.undo()
    x = tiny_example(2)
    with torch.no_grad():
        assert torch.equal(hetprune.load(out)(x), model_a(x))
    assert leftovers(tmp_path) == []


# -- hetprune apply --------------------------------------------------------------------------------

@pytest.fixture
def apply_args(tiny_spec, tmp_path):
    """A checkpoint of a tiny model and a recipe file for it; returns a function building the argv."""
    torch.manual_seed(5)
    dense = build(tiny_spec)
    ckpt = tmp_path / "dense.safetensors"
    save_weights(ckpt, dense)
    recipe_path = tmp_path / "recipe.json"
    make_recipe(tiny_spec).write(recipe_path)

    def argv(out="out", recipe=recipe_path, checkpoint=ckpt, *extra):
        args = ["apply", "--model", MODEL, "--model-kwargs", json.dumps(TINY_KWARGS), "--recipe", str(recipe),
                "--out", str(tmp_path / out)]
        return args + (["--checkpoint", str(checkpoint)] if checkpoint else []) + list(extra)

    argv.dense, argv.recipe_path, argv.ckpt = dense, recipe_path, ckpt
    return argv


def test_apply_command_prunes_a_checkpoint_and_saves_it(apply_args, tiny_spec, tmp_path, capsys):
    assert main(apply_args()) == 0
    printed = capsys.readouterr().out
    assert "1 attention + 2 activation sites removed, 2 MLPs merged" in printed and "MACs" in printed
    out = tmp_path / "out"
    assert folder_files(out) == {RECIPE_FILE, WEIGHTS_FILE}
    saved = hetprune.model.recipe.load_recipe(out)
    assert saved.base == tiny_spec
    assert saved.provenance["applied_to"]["source"] == f"checkpoint {apply_args.ckpt}"
    x = tiny_example(4)
    expected = apply_recipe(apply_args.dense, Recipe.read(apply_args.recipe_path)).eval()
    with torch.no_grad():
        assert torch.equal(hetprune.load(out)(x), expected(x))
    # again with the same result: fine; another recipe into the same folder: refused unless --overwrite
    assert main(apply_args()) == 0
    other = tmp_path / "other.json"
    make_recipe(tiny_spec, attn_removed=[3]).write(other)
    assert main(apply_args("out", other)) == 2
    assert "already holds a different result; pass --overwrite" in capsys.readouterr().err
    assert hetprune.model.recipe.load_recipe(out).attn_removed == [1]
    assert main(apply_args("out", other, apply_args.ckpt, "--overwrite")) == 0
    assert hetprune.model.recipe.load_recipe(out).attn_removed == [3]


def test_apply_command_reads_pth_checkpoints_safely(apply_args, tmp_path):
    pth = tmp_path / "dense.pth"
    torch.save({"model": apply_args.dense.state_dict()}, pth)
    assert main(apply_args("out", apply_args.recipe_path, pth)) == 0
    torch.save({"model": apply_args.dense.state_dict(), "x": _Exploit(str(tmp_path / "ran"))}, pth)
    assert main(apply_args("out2", apply_args.recipe_path, pth)) == 2
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out2").exists()


def test_apply_command_bad_input_is_one_error_line_and_writes_nothing(apply_args, tiny_spec, tmp_path, capsys):
    bad_arch = tmp_path / "deep.json"
    make_recipe(tiny_spec, arch={**arch_of(apply_args.dense), "depth": 12}).write(bad_arch)
    bad_index = tmp_path / "index.json"
    make_recipe(tiny_spec, act_removed=[0, 7], merged=[0]).write(bad_index)
    truncated = tmp_path / "truncated.json"
    truncated.write_text(apply_args.recipe_path.read_text()[:40])
    broken_ckpt = tmp_path / "broken.safetensors"
    broken_ckpt.write_bytes(apply_args.ckpt.read_bytes()[:-100])
    cases = [
        (apply_args("o1", bad_arch), "recipe was made for a model with depth=12, but this model has depth=4"),
        (apply_args("o2", bad_index), "act_removed has block indices [7] out of range"),
        (apply_args("o3", truncated), "is malformed or truncated"),
        (apply_args("o4", apply_args.recipe_path, broken_ckpt), "is malformed or truncated"),
        (apply_args("o5", apply_args.recipe_path, tmp_path / "missing.safetensors"), "does not exist"),
        (apply_args("o6", "no_such_recipe"), "is neither a file nor a shipped recipe; shipped: deit_base_hetdpt_paper"),
        (apply_args("o7", "deit_base_hetdpt_paper", None),
         "recipe was made for a model with depth=12, but this model has depth=4"),
        (apply_args("o8", apply_args.recipe_path, None, "--plugin", "no_such_plugin_module"), "cannot be imported"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("o", ".o"))) == []


def test_apply_command_interrupted_writes_nothing(apply_args, tmp_path, monkeypatch, capsys):
    real = hetprune.model.recipe.save_weights

    def save_then_die(path, *args, **kwargs):
        real(path, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(hetprune.model.recipe, "save_weights", save_then_die)
    assert main(apply_args()) == 130
    assert "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# -- the shipped recipe ------------------------------------------------------------------------------

def test_shipped_deit_base_recipe_resolves_and_fits_deit_base():
    assert "deit_base_hetdpt_paper" in shipped_recipes()
    recipe = resolve_recipe("deit_base_hetdpt_paper")
    assert recipe.base.name == "deit_base_patch16_224"
    assert recipe.attn_removed == [0, 3, 7, 8, 11] and recipe.act_removed == [2, 7, 8, 10, 11]
    assert recipe.n_attn + recipe.n_act == 10 and recipe.attn_mode == "identity"
    # the real architecture, on the meta device: shapes without 350 MB of weights
    with torch.device("meta"):
        model = timm.create_model(recipe.base.name, **recipe.base.kwargs)
        x = torch.empty(1, 3, 224, 224)
    assert arch_of(model) == recipe.arch
    dense_params, dense_macs = count_params(model), count_macs(model, x)
    apply_recipe(model, recipe)
    assert sorted(recipe.merged) == sorted(i for i in range(12) if isinstance(model.blocks[i].mlp, surgery.MergedMlp))
    d, h = 768, 3072
    attn_params = (d * 3 * d + 3 * d) + (d * d + d) + 2 * d  # qkv, proj, norm1
    mlp_saving = (d * h + h + h * d + d) - (d * d + d)  # fc1 + fc2 -> one D x D layer
    assert dense_params - count_params(model) == 5 * attn_params + 5 * mlp_saving
    n = 197
    attn_macs = n * d * 3 * d + 2 * n * n * d + n * d * d
    assert dense_macs - count_macs(model, x) == 5 * attn_macs + 5 * (n * (2 * d * h) - n * d * d)


def test_recipe_records_what_the_mergers_did_not_what_was_asked(tiny_spec, tmp_path):
    """linear-merge first, then ln-fold: nothing is left for ln-fold, so the recipe must not say fold_norm."""
    from hetprune_hetdpt.mergers import LayerNormFold, LinearMerge

    model = pruned_model(tiny_spec, make_recipe(tiny_spec, merged=[]))
    LinearMerge().merge(model)
    assert LayerNormFold().merge(model) == []
    recipe = recipe_from_model(model, tiny_spec, arch_of(build(tiny_spec)), fold_norm=True)
    assert recipe.fold_norm is False and recipe.merged == [0, 2]
    hetprune.save(tmp_path / "m", model, recipe)
    x = tiny_example()
    assert torch.equal(hetprune.load(tmp_path / "m")(x), model(x))
    folded = pruned_model(tiny_spec, make_recipe(tiny_spec, merged=[]))
    LayerNormFold().merge(folded)
    assert recipe_from_model(folded, tiny_spec, arch_of(build(tiny_spec))).fold_norm is True


@pytest.mark.slow
@pytest.mark.parametrize("mergers", ["[]", "[linear-merge]", "[ln-fold]", "[linear-merge, ln-fold]",
                                     "[ln-fold, linear-merge]"])
def test_every_merger_combination_gives_a_recipe_that_applies_exactly_to_the_base(trained_tiny, tmp_path, mergers):
    """Untrained after pruning, the saved model is the base's function with sites removed: its recipe applied to
    the base checkpoint (hetprune apply) must reproduce it, whatever the mergers did."""
    from hetprune.cli import main

    _, spec, ckpt = trained_tiny
    base = ["--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt)]
    out = tmp_path / "pruned"
    assert main(["prune", *base, "--strategy", "act-only", "--scorer", "magnitude", "--budget", "2",
                 "--set", "finetune.epochs=0", "--set", f"mergers={mergers}", "--out", str(out)]) == 0
    recipe = hetprune.model.recipe.load_recipe(out)
    assert len(recipe.merged) == (0 if mergers == "[]" else 2)
    assert recipe.fold_norm == (mergers.startswith("[ln-fold"))
    applied = tmp_path / "applied"
    assert main(["apply", *base, "--recipe", str(out / "recipe.json"), "--out", str(applied)]) == 0
    x = tiny_example()
    saved, replayed = hetprune.load(out), hetprune.load(applied)
    assert saved.state_dict().keys() == replayed.state_dict().keys()
    assert torch.allclose(saved(x), replayed(x), atol=1e-5)


# -- a recipe is data, never a way to reach files or the network ------------------------------------
# Each entry: kwargs a shared recipe's base could carry to make building the model read a file (``evil``:
# a pickled .pth whose unpickling makes a folder) or the network.
SOURCE_KWARGS = {
    "checkpoint_path": lambda evil: {"checkpoint_path": str(evil)},
    "pretrained": lambda evil: {"pretrained": True},
    "pretrained-with-pretrained_strict": lambda evil: {"pretrained": True, "pretrained_strict": False},
    "pretrained_strict-alone": lambda evil: {"pretrained_strict": False},
    "pretrained_cfg_overlay-file": lambda evil: {"pretrained_cfg_overlay": {"file": str(evil)}},
    "pretrained_cfg_overlay-url": lambda evil: {"pretrained_cfg_overlay": {"url": "https://example.invalid/w.pth"}},
    "pretrained_cfg_overlay-hf_hub_id": lambda evil: {"pretrained_cfg_overlay": {"hf_hub_id": "someone/evil"}},
    "pretrained_cfg-file": lambda evil: {"pretrained_cfg": {"file": str(evil)}},
    "pretrained_cfg-tag": lambda evil: {"pretrained_cfg": "augreg_in21k"},
    "cache_dir": lambda evil: {"cache_dir": str(evil.parent)},
    "pretrained_model_args": lambda evil: {"pretrained_model_args": {"img_size": 16}},
    "a-path-in-another-kwarg": lambda evil: {"weight_init": str(evil)},
}


@pytest.fixture
def no_reading(monkeypatch, tmp_path):
    """Fail the test if anything opens the planted file, unpickles, loads weights or connects anywhere."""
    import builtins
    import io
    import socket

    from timm.models import _builder, _factory, _helpers

    evil = tmp_path / "evil.pth"
    marker = tmp_path / "code-ran"
    torch.save({"state_dict": {"w": torch.ones(1)}, "x": _Exploit(str(marker))}, evil)

    def forbidden(*args, **kwargs):
        raise AssertionError(f"a recipe made hetprune read or fetch something: {args[:2]}")

    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if Path(str(file)).name == evil.name:
            forbidden(file)
        return real_open(file, *args, **kwargs)

    for target, name in [(torch, "load"), (_helpers, "load_checkpoint"), (_factory, "load_checkpoint"),
                         (_builder, "load_pretrained"), (socket.socket, "connect")]:
        monkeypatch.setattr(target, name, forbidden)
    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    yield evil
    assert not marker.exists(), "the pickle ran"


def _shared_folder(tiny_spec, tmp_path, kwargs: dict) -> Path:
    """A saved pruned model whose recipe.json was edited (as a shared folder could be) to carry ``kwargs``."""
    recipe = make_recipe(tiny_spec)
    out = hetprune.save(tmp_path / "shared", pruned_model(tiny_spec, recipe), recipe)
    d = json.loads((out / RECIPE_FILE).read_text())
    d["base"]["kwargs"].update(kwargs)
    (out / RECIPE_FILE).write_text(json.dumps(d))
    return out


@pytest.mark.parametrize("key", sorted(SOURCE_KWARGS))
def test_load_refuses_kwargs_that_read_files_or_the_network(key, tiny_spec, tmp_path, no_reading):
    kwargs = SOURCE_KWARGS[key](no_reading)
    folder = _shared_folder(tiny_spec, tmp_path, kwargs)
    with pytest.raises(HetpruneError, match="could make building it read a file or the network") as err:
        hetprune.load(folder)
    named = next(iter(kwargs))
    assert named in str(err.value) and "allow_kwargs" in str(err.value)


@pytest.mark.parametrize("key", sorted(SOURCE_KWARGS))
def test_apply_recipe_refuses_them_too(key, tiny_spec, tiny_model, tmp_path, no_reading):
    recipe = make_recipe(tiny_spec)
    recipe.base = ModelSpec(tiny_spec.name, {**tiny_spec.kwargs, **SOURCE_KWARGS[key](no_reading)})
    with pytest.raises(HetpruneError, match="could make building it read a file or the network"):
        apply_recipe(tiny_model, recipe)
    assert not any(surgery.site_removed(tiny_model, s) for s in hetprune.sites(tiny_model, present_only=False))


def test_kwargs_the_caller_passes_are_allowed(tiny_spec, tmp_path):
    """In code, the caller may vouch for them: allow_kwargs names what it trusts (here a harmless cache_dir)."""
    folder = _shared_folder(tiny_spec, tmp_path, {"cache_dir": str(tmp_path / "hub-cache")})
    with pytest.raises(HetpruneError, match="cache_dir"):
        hetprune.load(folder)
    loaded = hetprune.load(folder, allow_kwargs=["cache_dir"])
    want = pruned_model(tiny_spec, make_recipe(tiny_spec))
    x = tiny_example(2)
    with torch.no_grad():
        assert torch.equal(loaded(x), want(x))
    with pytest.raises(HetpruneError, match="a list of kwarg names"):
        hetprune.load(folder, allow_kwargs="cache_dir")


def test_apply_command_refuses_a_recipe_that_reads_a_file_but_takes_typed_kwargs(apply_args, tiny_spec, tmp_path,
                                                                                   capsys, no_reading):
    recipe_path = tmp_path / "shared.json"
    recipe = make_recipe(tiny_spec)
    recipe.base = ModelSpec(tiny_spec.name, {**tiny_spec.kwargs, "checkpoint_path": str(no_reading)})
    recipe.write(recipe_path)
    argv = ["apply", "--recipe", str(recipe_path), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --recipe ") and err.count("\n") == 1 and "checkpoint_path" in err, err
    assert not (tmp_path / "o").exists()
    # the same recipe with the base model typed on the command line: its kwargs are what the user gave
    assert main(apply_args("o", recipe_path, None)) == 0
    assert hetprune.model.recipe.load_recipe(tmp_path / "o").base == tiny_spec


@pytest.mark.parametrize("mergers", [["linear-merge"], ["ln-fold"]])
def test_a_float64_model_round_trips_prune_save_load(digits_data, tmp_path, mergers):
    """Issue 34, item 9: merged layers take the base's dtype when a recipe is replayed (they were float32)."""
    from hetprune.harness.testing import TINY_SETTINGS

    def make():
        torch.manual_seed(0)
        return build(ModelSpec(MODEL, TINY_KWARGS)).double()

    x = torch.stack([digits_data.train[i][0] for i in range(64)]).double()
    y = torch.tensor([int(digits_data.train[i][1]) for i in range(64)])
    batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    task = hetprune.Task(train=batches, val=batches[:2], metric=lambda m, v: 1.0,
                         loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))
    result = hetprune.prune(make(), task, strategy="act-only", budget=3, out=tmp_path / "r", progress=False,
                            log=lambda m: None, settings={**TINY_SETTINGS, "scorer": "magnitude", "mergers": mergers})
    assert result.recipe.merged and next(result.model.parameters()).dtype == torch.float64
    back = hetprune.load(tmp_path / "r", model=make())
    assert {p.dtype for p in back.parameters()} == {torch.float64}
    with torch.no_grad():
        assert torch.equal(back(x[:4]), result.model(x[:4]))
