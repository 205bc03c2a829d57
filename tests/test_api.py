"""hetprune as a library: hetprune.prune on the user's own model, task, data, metric and training loop."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset
from torch.utils.flop_counter import FlopCounterMode

import hetprune
from hetprune import BlockLayout, HetpruneError, Task
from hetprune.model.adapters import generic
from hetprune.pruning.budget import Budget
from hetprune.model.macs import count_macs
from hetprune.harness.testing import TINY_SETTINGS

from conftest import TINY_KWARGS


# -- the user's models ------------------------------------------------------------------------------------

class Wrapped(nn.Module):
    """A timm ViT used as a backbone, under the user's own head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = hetprune.model.spec.build(hetprune.ModelSpec("vit_tiny_patch16_224",
                                                                 {**TINY_KWARGS, "num_classes": 0}))
        self.head = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x):
        return self.head(self.backbone(x))


class Mixer(nn.Module):
    """The user's attention: other names, SDPA inside, no timm class."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.num_heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class FeedForward(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ln_a, self.mix, self.ln_b, self.ff = nn.LayerNorm(dim), Mixer(dim, 2), nn.LayerNorm(dim), FeedForward(dim)

    def forward(self, x):
        x = x + self.mix(self.ln_a(x))
        return x + self.ff(self.ln_b(x))


class Encoder(nn.Module):
    def __init__(self, dim: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(Layer(dim) for _ in range(depth))


class MyTransformer(nn.Module):
    """A pre-norm transformer the user wrote: patches, blocks at ``encoder.layers``, mean pooling."""

    def __init__(self, dim: int = 32, depth: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(1, dim, 4, 4)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.encoder = Encoder(dim, depth)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for layer in self.encoder.layers:
            t = layer(t)
        return self.head(self.norm(t).mean(1))


LAYOUT = BlockLayout(norm1="ln_a", attn="mix", attn_scale=None, norm2="ln_b", mlp="ff", mlp_scale=None,
                     drop_path2=None, act="act")


# -- the user's task --------------------------------------------------------------------------------------

def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def accuracy(model, val):
    hits = total = 0
    for x, y in val:
        hits += int((model(x).argmax(-1) == y).sum())
        total += len(y)
    return 100.0 * hits / total


def user_task(digits_data, **changes) -> Task:
    parts = dict(train=DataLoader(Subset(digits_data.train, range(64)), batch_size=16),
                 val=DataLoader(Subset(digits_data.val, range(64)), batch_size=32),
                 loss=ce, metric=accuracy, metric_name="acc", name="digits-in-code")
    return Task(**{**parts, **changes})


def outputs(model, x):
    with torch.no_grad():
        return model.eval()(x)


X = torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(5))


# -- prune: a backbone inside the user's module, a user-written transformer ---------------------------------

def test_prune_a_timm_backbone_inside_the_users_module_and_reload_it_bit_identically(digits_data, tmp_path):
    model = Wrapped()
    before = copy.deepcopy(model.state_dict())
    result = hetprune.prune(model, user_task(digits_data), strategy="act-only", budget=2, settings=TINY_SETTINGS,
                            out=tmp_path / "out", progress=False, log=lambda m: None)
    r = result.report
    assert (r["n_attn"], r["n_act"]) == (0, 2) and r["metric_name"] == "acc" and "top1" not in r
    kept = [i for i, b in enumerate(result.model.backbone.blocks) if isinstance(getattr(b.mlp, "act", None), nn.GELU)]
    assert len(kept) == 4 - 2 and sorted(set(range(4)) - set(kept)) == result.recipe.act_removed
    assert isinstance(result.model.head, nn.Sequential)          # the user's head is kept as it was
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())   # the dense model is untouched
    recipe = json.loads((tmp_path / "out" / "recipe.json").read_text())
    assert recipe["adapter"] == "timm-vit@backbone" and recipe["base"]["library"] == "user"
    assert recipe["base"]["name"].endswith("Wrapped")
    loaded = hetprune.load(tmp_path / "out", model=Wrapped())
    assert torch.equal(outputs(loaded, X), outputs(result.model, X))
    with pytest.raises(HetpruneError, match="built by the user"):
        hetprune.load(tmp_path / "out")


def test_prune_a_user_written_transformer_through_the_generic_adapter(digits_data, tmp_path):
    model = MyTransformer()
    adapter = generic(blocks="encoder.layers", layout=LAYOUT)
    with FlopCounterMode(display=False) as counter:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            model(X[:1])
    with hetprune.model.adapters.serving(adapter):
        assert count_macs(model, X[:1]) == counter.get_total_flops() // 2   # the user's attention is counted
    result = hetprune.prune(model, user_task(digits_data), strategy="mix50", budget=2, adapter=adapter,
                            settings={**TINY_SETTINGS, "scorer": "taylor"}, out=tmp_path / "out", progress=False,
                            log=lambda m: None)
    assert (result.report["n_attn"], result.report["n_act"]) == (1, 1)
    assert result.report["macs"] < result.report["dense_macs"]
    loaded = hetprune.load(tmp_path / "out", model=MyTransformer(), adapter=adapter)
    assert torch.equal(outputs(loaded, X), outputs(result.model, X))
    recipe = hetprune.model.recipe.load_recipe(tmp_path / "out")
    fresh = hetprune.apply_recipe(MyTransformer(), recipe, adapter=adapter)
    assert [type(b).__name__ for b in fresh.encoder.layers] == [type(b).__name__ for b in result.model.encoder.layers]


def test_a_transformer_no_adapter_knows_is_found_nowhere_and_says_how_to_serve_it(digits_data, tmp_path):
    with pytest.raises(HetpruneError, match=r"no architecture adapter recognises MyTransformer.*generic"):
        hetprune.prune(MyTransformer(), user_task(digits_data), strategy="act-only", budget=1,
                       settings=TINY_SETTINGS, out=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# -- the user's own training loop, and a metric where lower is better -------------------------------------------

def test_the_users_training_loop_runs_every_fine_tune_hetprune_plans(digits_data, tmp_path):
    calls = []

    def finetune(model, teacher, schedule):
        calls.append((schedule.stage, schedule.epochs, schedule.subset, schedule.lr))
        opt = torch.optim.SGD(model.parameters(), lr=schedule.lr)
        for _ in range(schedule.epochs):
            for batch in DataLoader(Subset(digits_data.train, range(32)), batch_size=16):
                opt.zero_grad()
                ce(model, batch).backward()
                opt.step()
        return [{"loss": 0.0}]

    settings = {**TINY_SETTINGS, "scorer": "gate-taylor",
                "hetdpt": {"axis_points": 2, "mixed_points": 1, "point_selection": "progressive", "checks": "points",
                           "checks_options": {"points": {"count": 3}}}}
    result = hetprune.prune(Wrapped(), user_task(digits_data, finetune=finetune), strategy="hetdpt", budget=2,
                            settings=settings, out=tmp_path / "out", progress=False, log=lambda m: None)
    s = result.report["settings"]
    points, checks = result.report["allocation"]["points"], result.report["allocation"]["verified"]

    def planned(section):
        return ("point", s[section]["epochs"], s[section]["subset"], s[section]["lr"])

    # progressive points (the paper's): one fine-tune per path step (the dense point has none), then each check's
    # extra steps and its check fine-tune (hetdpt.checks points)
    step = planned(next(p["point_finetune"] for p in points if "point_finetune" in p))
    n_steps = sum(p.get("fine_tunes", 0) for p in points) + sum(c["extra_steps"] for c in checks)
    assert len(checks) == 3 and n_steps >= len(points) - 1
    assert sorted(c for c in calls if c[0] == "point") == sorted(
        [step] * n_steps + [planned(c["check_finetune"]) for c in checks])
    gate = [c for c in calls if c[0] == "gate"]
    n_removals = result.report["n_attn"] + result.report["n_act"]
    opts = {"epochs_per_removal": 1, "warmup_epochs": 1}   # gate-taylor's defaults
    assert [c[1] for c in gate] == [opts["epochs_per_removal"] + opts["warmup_epochs"]] + \
        [opts["epochs_per_removal"]] * (n_removals - 1)
    assert all(c[2] == s["scoring"]["subset"] and c[3] == s["short_finetune"]["lr"] for c in gate)
    assert calls[-1] == ("finetune", s["finetune"]["epochs"], s["finetune"]["subset"], s["finetune"]["lr"])
    assert len(calls) == n_steps + len(checks) + n_removals + 1


def test_a_lower_is_better_metric_is_minimised_by_the_predictors_pick(digits_data, tmp_path, monkeypatch):
    from hetprune.pruning.pipeline import PruneJob
    from hetprune.core.plugins import get_registry
    from hetprune_hetdpt.strategy import HetDPT

    def truth(a, m):   # a loss whose lowest point on the budget line is at a = 1
        return 2.0 + (a - 1) ** 2 + 0.1 * m

    monkeypatch.setattr(HetDPT, "collect_points", lambda self, job, plan: [
        {"n_attn": a, "n_act": m, "metric": truth(a, m)} for a, m in plan])
    val_loss = lambda model, val: float(sum(ce(model, b) for b in val) / len(val))   # noqa: E731
    task = user_task(digits_data, metric=val_loss, higher_is_better=False, metric_name="val loss")
    settings = hetprune.harness.testing.tiny_settings(HetDPT.defaults, {"hetdpt": {"predictor": "poly", "checks": "none"}})
    job = PruneJob(dense=Wrapped(), spec=None, data=None, task=task, budget=Budget(sites=3), settings=settings,
                   registry=get_registry(), workdir=tmp_path, progress=False, log=lambda m: None)
    (a, m), info = HetDPT().allocate(job)
    assert (a, m) == (1, 2) == min(job.feasible_pairs(), key=lambda p: truth(*p))
    with torch.no_grad():
        assert job.evaluate(job.dense) == pytest.approx(val_loss(job.dense.eval(), task.val))


# -- one path: the CLI calls the library ------------------------------------------------------------------------

def test_the_cli_and_the_library_give_the_same_recipe_and_metric(trained_tiny, digits_data, tmp_path):
    from hetprune.cli import main
    from hetprune.core.io import load_weights
    from hetprune.model.spec import build, load_state_into
    from hetprune.training.task import classification

    _, spec, ckpt = trained_tiny
    sets = ["finetune.epochs=1", "finetune.subset=48", "finetune.batch_size=16", "scoring.subset=16",
            "scoring.batches=1", "scoring.batch_size=16"]
    assert main(["prune", "--model", spec.name, "--model-kwargs", json.dumps(spec.kwargs), "--checkpoint", str(ckpt),
                 "--data", "digits", "--strategy", "mix50", "--scorer", "taylor", "--budget", "2", "--seed", "3",
                 *[a for s in sets for a in ("--set", s)], "--out", str(tmp_path / "cli")]) == 0
    model = build(spec)
    load_state_into(model, load_weights(ckpt), "checkpoint")
    settings = {"scorer": "taylor", "seed": 3, "finetune": {"epochs": 1, "subset": 48, "batch_size": 16},
                "scoring": {"subset": 16, "batches": 1, "batch_size": 16}}
    result = hetprune.prune(model, classification(digits_data), strategy="mix50", budget=2, settings=settings,
                            spec=spec, out=tmp_path / "api", progress=False, log=lambda m: None)
    cli = json.loads((tmp_path / "cli" / "report.json").read_text())
    strip = lambda r: {k: v for k, v in r.to_dict().items() if k != "provenance"}   # noqa: E731
    assert strip(hetprune.model.recipe.load_recipe(tmp_path / "cli")) == strip(result.recipe)
    assert cli["metric"] == result.report["metric"] == cli["top1"]
    assert cli["metric_dense"] == result.report["metric_dense"]
    assert torch.equal(outputs(hetprune.load(tmp_path / "cli"), X), outputs(result.model, X))


# -- bad input: one clear error, nothing written -----------------------------------------------------------------

def _boom(model, teacher, schedule):
    raise ValueError("boom")


BAD = {
    "no adapter": (lambda d: (nn.Sequential(nn.Linear(4, 4)), user_task(d), {}),
                   "no architecture adapter recognises Sequential"),
    "no such block path": (lambda d: (MyTransformer(), user_task(d),
                                      {"adapter": generic(blocks="encoder.blocks", layout=LAYOUT)}),
                           "has no submodule 'encoder.blocks'"),
    "metric NaN": (lambda d: (Wrapped(), user_task(d, metric=lambda m, v: float("nan")), {}),
                   r"metric \(acc\) returned nan"),
    "metric not a number": (lambda d: (Wrapped(), user_task(d, metric=lambda m, v: "high"), {}),
                            r"metric \(acc\) must return a number, got str"),
    "val yields nothing": (lambda d: (Wrapped(), user_task(d, val=[]), {}), "val data .* yields no batch"),
    "train yields nothing": (lambda d: (Wrapped(), user_task(d, train=[]), {}), "train data .* yields no batch"),
    "finetune raises": (lambda d: (Wrapped(), user_task(d, finetune=_boom), {}),
                        r"finetune callback _boom raised ValueError: boom \(during the 'finetune' fine-tune\)"),
    "budget too large": (lambda d: (Wrapped(), user_task(d), {"budget": 99}), "cannot|at most|more than"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_error_and_nothing_is_written(case, digits_data, tmp_path):
    make, pattern = BAD[case]
    model, task, extra = make(digits_data)
    kwargs = {"strategy": "act-only", "budget": 1, "settings": {**TINY_SETTINGS, "scorer": "magnitude"},
              "out": tmp_path / "out", "progress": False, "log": lambda m: None, **extra}
    with pytest.raises(HetpruneError, match=pattern):
        hetprune.prune(model, task, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_task_is_checked_when_it_is_made(digits_data):
    loader = DataLoader(Subset(digits_data.val, range(8)), batch_size=4)
    with pytest.raises(HetpruneError, match="iterator, which runs dry"):
        Task(train=iter(loader), val=loader, loss=ce, metric=accuracy)
    with pytest.raises(HetpruneError, match="loss must be a function"):
        Task(train=loader, val=loader, loss="ce", metric=accuracy)
    with pytest.raises(HetpruneError, match="finetune must be a function"):
        Task(train=loader, val=loader, loss=ce, metric=accuracy, finetune=3)


# -- compare and ablate on the user's task ---------------------------------------------------------------------

def test_compare_and_ablate_run_on_the_users_model_and_task(digits_data, tmp_path):
    task = user_task(digits_data)
    result = hetprune.compare(Wrapped(), task, strategies=["act-only", "attn-only"], budgets=[1], seeds=[0],
                              settings={**TINY_SETTINGS, "scorer": "magnitude"}, out=tmp_path / "cmp",
                              batch_sizes=[2], speed_budget_s=0, progress=False, log=lambda m: None)
    assert [(r["strategy"], r["n_attn"], r["n_act"]) for r in result.rows] == [("act-only", 0, 1), ("attn-only", 1, 0)]
    assert all(r["metric_name"] == "acc" and "top1" not in r for r in result.rows)
    assert "| acc before FT | acc |" in result.markdown
    assert (tmp_path / "cmp" / "results.csv").read_text().splitlines()[0].split(",")[6:8] == \
        ["acc_before_finetune", "acc"]
    assert result.dense["metric"] == pytest.approx(accuracy(Wrapped().eval(), task.val))
    abl = hetprune.ablate(Wrapped(), task, budget=2, seeds=[0],
                          settings={**TINY_SETTINGS, "scorer": "magnitude"},
                          out=tmp_path / "abl", progress=False, log=lambda m: None)
    assert abl["metric_name"] == "acc" and len(abl["splits"]) == 3      # 0+2, 1+1, 2+0
    assert (tmp_path / "abl" / "ablation.md").read_text().count("acc") >= 2


def test_the_generic_adapter_passes_the_conformance_kit():
    from hetprune.harness.testing import ConformanceError, check_architecture

    def make_model():   # norms with their own affine, so that which norm is which matters
        model = MyTransformer()
        gen = torch.Generator().manual_seed(3)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.data = 1 + 0.5 * torch.randn(m.weight.shape, generator=gen)
                m.bias.data = 0.5 * torch.randn(m.bias.shape, generator=gen)
        return model

    check_architecture(generic(blocks="encoder.layers", layout=LAYOUT), make_model=make_model, example=X)
    wrong = BlockLayout(norm1="ln_b", attn="mix", attn_scale=None, norm2="ln_a", mlp="ff", mlp_scale=None,
                        drop_path2=None, act="act")   # the norms swapped: removal no longer matches the reference
    with pytest.raises(ConformanceError, match="functional reference"):
        check_architecture(generic(blocks="encoder.layers", layout=wrong), make_model=make_model, example=X)


@pytest.mark.parametrize("harness", ["compare", "ablate"])
def test_compare_and_ablate_leave_no_folder_for_a_budget_the_model_cannot_meet(harness, digits_data, tmp_path):
    run = getattr(hetprune, harness)
    kwargs = {"budgets": [99]} if harness == "compare" else {"budget": 99}
    with pytest.raises(HetpruneError, match="cannot|at most|more than"):
        run(Wrapped(), user_task(digits_data), settings={**TINY_SETTINGS, "scorer": "magnitude"},
            out=tmp_path / "out", progress=False, log=lambda m: None, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_prune_gives_the_callers_model_back_in_its_own_modes(digits_data, tmp_path):
    """Issue 34, item 11: prune() evaluates the dense model; it left it in eval mode."""
    model = Wrapped().train()
    model.head.eval()   # a mix of modes, as a user freezing a part would have
    modes = {name: m.training for name, m in model.named_modules()}
    before = copy.deepcopy(model.state_dict())
    hetprune.prune(model, user_task(digits_data), strategy="act-only", budget=1, settings=TINY_SETTINGS,
                   progress=False, log=lambda m: None)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_fine_tune_that_makes_the_model_worse_is_said(digits_data, trained_tiny):
    """Issue 34, item 12: a fine-tune that ends below where it started was silent."""
    def ruin(model, teacher, schedule):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.0)   # whatever it was, it is now constant
        return []

    logged = []
    hetprune.prune(copy.deepcopy(trained_tiny[0]), user_task(digits_data, finetune=ruin), strategy="act-only",
                   budget=1, settings={**TINY_SETTINGS, "scorer": "magnitude"}, progress=False, log=logged.append)
    assert any("warning: the fine-tune made the model worse" in line for line in logged)
    logged.clear()
    hetprune.prune(copy.deepcopy(trained_tiny[0]), user_task(digits_data), strategy="act-only", budget=1,
                   settings={**TINY_SETTINGS, "scorer": "magnitude", "finetune": {"epochs": 0}}, progress=False,
                   log=logged.append)
    assert not any("made the model worse" in line for line in logged)


class TwoHeads(nn.Module):
    """A timm ViT backbone under two heads: the class token's logits and per-token logits (as a detection
    or segmentation model has several outputs)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = hetprune.model.spec.build(hetprune.ModelSpec("vit_tiny_patch16_224",
                                                                 {**TINY_KWARGS, "num_classes": 0}))
        self.cls_head, self.token_head = nn.Linear(32, 10), nn.Linear(32, 3)

    def forward(self, x):
        tokens = self.backbone.forward_features(x)
        return self.cls_head(tokens[:, 0]), {"tokens": self.token_head(tokens[:, 1:])}


def test_a_model_with_several_outputs_is_pruned_merged_checked_and_reloaded(digits_data, tmp_path):
    """Issue 34, item 15: the contract's checks read a model's output as one tensor ('tuple' object has no
    attribute 'shape')."""
    def loss(model, batch):
        cls, extra = model(batch[0])
        return F.cross_entropy(cls, batch[1]) + extra["tokens"].pow(2).mean()

    def metric(model, val):
        return accuracy(lambda x: model(x)[0], val)

    task = user_task(digits_data, loss=loss, metric=metric)
    for strategy in ("act-only", "mix50"):   # act-only merges every MLP it linearised
        result = hetprune.prune(TwoHeads(), task, strategy=strategy, budget=2, out=tmp_path / strategy,
                                settings={**TINY_SETTINGS, "scorer": "taylor"}, progress=False, log=lambda m: None)
        back = hetprune.load(tmp_path / strategy, model=TwoHeads())
        got, want = outputs(back, X), outputs(result.model, X)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1]["tokens"], want[1]["tokens"])
    assert result.recipe.n_attn == 1 and hetprune.core.tensors.shapes(want) == {"[0]": (3, 10),
                                                                          "[1]['tokens']": (3, 16, 3)}


def test_the_contract_names_a_changed_output_of_a_model_with_several():
    from hetprune.model.checks import runs

    model = TwoHeads()
    shape = hetprune.core.tensors.shapes(outputs(model, X))
    model.token_head = nn.Linear(32, 4)
    with pytest.raises(hetprune.core.contract.Violation, match=r"\[1\]\['tokens'\] \(3, 16, 3\).*\[1\]\['tokens'\] "
                                                          r"\(3, 16, 4\)"):
        runs(model, X, "remove(act1)", shape)


def test_tied_blocks_are_refused_up_front_saying_why(digits_data, tmp_path):
    """Issue 34, item 18: nn.Sequential(*[block] * 4) ended in a contract violation blaming hetprune."""
    model = MyTransformer(depth=1)
    model.encoder.layers = nn.ModuleList([model.encoder.layers[0]] * 4)
    with pytest.raises(HetpruneError, match=r"MyTransformer: one block object sits at depths 0, 1, 2, 3; .*build each "
                                            r"block separately"):
        hetprune.prune(model, user_task(digits_data), strategy="act-only", budget=1, out=tmp_path / "out",
                       adapter=generic(blocks="encoder.layers", layout=LAYOUT), settings=TINY_SETTINGS,
                       progress=False)
    shared = MyTransformer(depth=2)
    shared.encoder.layers[1].ff = shared.encoder.layers[0].ff
    with pytest.raises(HetpruneError, match=r"blocks 0 and 1 share one module \(ff of block 0 is ff of block 1\)"):
        hetprune.prune(shared, user_task(digits_data), strategy="act-only", budget=1, out=tmp_path / "out",
                       adapter=generic(blocks="encoder.layers", layout=LAYOUT), settings=TINY_SETTINGS,
                       progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_model_with_several_outputs_exports_and_each_output_is_verified(digits_data, tmp_path):
    """Issue 34, item 15, the export's check: ONNX Runtime and the reloaded .pt2 give every output, each
    compared with PyTorch (only the first was)."""
    from hetprune.measure.export import export_onnx, export_pt2

    model = TwoHeads().eval()
    hetprune.model.surgery.remove_activation(model.backbone, 1)
    hetprune.model.surgery.merge_all(model.backbone)
    onnx_check = export_onnx(model, tmp_path / "m.onnx", dynamic_batch=True)
    assert onnx_check["outputs"] == 2 and onnx_check["relative_error"] < 1e-4
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["output_0", "output_1"]
    got = session.run(None, {"pixel_values": X.numpy()})
    want = outputs(model, X)
    assert torch.allclose(torch.from_numpy(got[1]), want[1]["tokens"], atol=1e-4)
    assert export_pt2(model, tmp_path / "m.pt2")["outputs"] == 2
