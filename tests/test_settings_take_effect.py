"""Issue 56: every setting a run accepts is used where it runs, or refused before anything trains."""

from __future__ import annotations

import copy

import pytest
import torch

from hetprune import HetpruneError
from hetprune.harness.testing import tiny_job
from hetprune.pruning.budget import Budget
from hetprune.pruning.pipeline import select_sites
from hetprune.training import train as train_mod
from hetprune.core import loader

# a separate teacher small enough for a test: a timm ViT of depth 1 for the tiny digits
TEACHER = {"teacher": "vit_tiny_patch16_224",
           "teacher_kwargs": {"img_size": 16, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32,
                              "depth": 1, "num_heads": 2}}
GATE = {"scorer": "gate-taylor", "scoring": {"subset": 32},
        "scorer_options": {"gate-taylor": {"warmup_epochs": 1, "epochs_per_removal": 1}}}


def hetdpt():
    from hetprune_hetdpt.strategy import HetDPT

    return HetDPT()


def watch_steps(monkeypatch) -> list[dict]:
    """What each training step of any loop saw: its teacher, the student's drop-path rates, and (a gate
    phase's step) the weights' learning rate and whether gradients were clipped."""
    from timm.layers import DropPath

    seen: list[dict] = []
    real_loss, real_step = train_mod.ClassificationSource.loss, train_mod.optimisation_step

    def loss(self, net, batch, teacher, cfg, device, amp):
        model = getattr(net, "module", net)
        seen.append({"teacher": teacher, "drop": [m.drop_prob for m in model.modules() if isinstance(m, DropPath)]})
        return real_loss(self, net, batch, teacher, cfg, device, amp)

    def step(loss, optimizers, scaler, *args, **kwargs):
        seen[-1].update(lr=optimizers[0].param_groups[0]["lr"], clip=kwargs.get("clip"))
        return real_step(loss, optimizers, scaler, *args, **kwargs)

    monkeypatch.setattr(train_mod.ClassificationSource, "loss", loss)
    monkeypatch.setattr(train_mod, "optimisation_step", step)
    return seen


# -- defect 1: the gate phase distils from short_finetune's teacher, and is keyed by it ---------------------------

def test_the_gate_phase_distils_from_short_finetunes_teacher_and_its_checkpoint_is_keyed_by_it(tmp_path, monkeypatch):
    job = tiny_job(Budget(sites=2), tmp_path, hetdpt(), settings={**GATE, "short_finetune": {**TEACHER, "kd": "soft"}})
    teacher, teacher_key = job.teacher_for(job.train_config("short_finetune"))
    seen = watch_steps(monkeypatch)
    select_sites(job, copy.deepcopy(job.dense), {"attn": 1, "act": 1})
    assert seen and all(s["teacher"] is teacher for s in seen)
    key = torch.load(tmp_path / "scoring" / "gate-checkpoint.pt", weights_only=True)["key"]
    assert key["teacher"] == teacher_key != job.base_key


# -- suspect 1: the gate phase trains on short_finetune's schedule, not only its rate and batch --------------------

def test_the_gate_phase_takes_short_finetunes_warm_up_cosine_drop_path_and_clipping(tmp_path, monkeypatch):
    schedule = {"lr": 1e-3, "warmup_epochs": 1, "warmup_lr": 1e-6, "min_lr": 1e-5, "drop_path": 0.3,
                "clip_grad": 1.0, "kd": "none"}
    job = tiny_job(Budget(sites=2), tmp_path, hetdpt(), settings={**GATE, "short_finetune": schedule})
    seen = watch_steps(monkeypatch)
    model = copy.deepcopy(job.dense)
    select_sites(job, model, {"attn": 1, "act": 1})
    # 32 images at batch 16: 2 steps an epoch; removal 1 after 2 epochs (1 of warm-up), removal 2 after 1 more
    lrs = [s["lr"] for s in seen]
    assert len(lrs) == 6
    assert lrs[0] == pytest.approx(1e-6)                   # the schedule's warm-up from warmup_lr ...
    assert lrs[1] < lrs[2] and lrs[3] < lrs[2] < 1e-3      # ... then a cosine decay
    assert lrs[4] == pytest.approx(1e-3) and lrs[5] < lrs[4]   # restarted after the first removal, no warm-up
    assert all(s["drop"] == pytest.approx([0.1, 0.1, 0.2, 0.2, 0.3, 0.3]) for s in seen)   # timm's rule, 4 blocks
    assert all(s["clip"] is not None and s["clip"].clip_grad == 1.0 for s in seen)
    assert not any(type(m).__name__ == "DropPath" for m in model.modules())   # put back as it was built


def test_clipping_reaches_the_weights_of_a_gate_phase_step(monkeypatch):
    """``optimisation_step(clip=cfg)`` clips the first optimizer's gradients (the weights'), not the others'."""
    from hetprune.core.config import TrainConfig

    w, s = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt_w, opt_s = torch.optim.SGD([w], lr=1.0), torch.optim.SGD([s], lr=1.0)
    loss = 100 * (w.sum() + s.sum())
    scaler = train_mod.grad_scaler(torch.device("cpu"), "none")
    train_mod.optimisation_step(loss, [opt_w, opt_s], scaler, clip=TrainConfig(clip_grad=0.5))
    assert float(w.grad.norm()) == pytest.approx(0.5)
    assert float(s.grad.norm()) == pytest.approx(100 * 3 ** 0.5)


def no_training(monkeypatch) -> None:
    """Any training step fails the test: what is refused must be refused before anything trains."""
    def trained(*args, **kwargs):
        raise AssertionError("a training step ran before the refusal")

    monkeypatch.setattr(train_mod, "optimisation_step", trained)
    monkeypatch.setattr(train_mod, "_train_epochs", trained)


# -- defect 2: a selection setting the task's own data does not hold is refused --------------------------------

def task_with_selection(data, selection: bool):
    from torch.utils.data import DataLoader

    from hetprune import Task
    from hetprune.training.task import _cross_entropy, _top1

    return Task(DataLoader(data.train, batch_size=16), DataLoader(data.val, batch_size=64), _cross_entropy, _top1,
                selection=DataLoader(data.selection, batch_size=64) if selection else None, name="own")


@pytest.mark.parametrize("given, selection, held", [("task", 0, "a selection split of 300 items"),
                                                    ("task-without", 200, "no selection split"),
                                                    ("bundle", 200, "a selection split of 300 items"),
                                                    ("bundle", 0, "a selection split of 300 items")])
def test_a_selection_setting_the_tasks_data_does_not_hold_is_refused_before_any_training(
        given, selection, held, monkeypatch, tmp_path):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    data = tiny_data()   # digits: 300 training images held out as the selection split
    task = data if given == "bundle" else task_with_selection(data, given == "task")
    no_training(monkeypatch)
    with pytest.raises(HetpruneError, match=rf"the selection setting \({selection}\) does not match the task's "
                                            rf"data, which has {held}"):
        hetprune.prune(tiny_model(), task, strategy="act-only", budget=1,
                       settings={**TINY_SETTINGS, "selection": selection}, progress=False, log=lambda m: None)


def test_a_selection_setting_the_data_holds_is_accepted():
    from hetprune.harness.testing import tiny_data, tiny_model
    from hetprune.pruning.run_start import start_run

    for selection, task in ((300, tiny_data()), (0, task_with_selection(tiny_data(), False)), (None, tiny_data())):
        start = start_run(["act-only"], [Budget(sites=1)], settings={"device": "cpu", "selection": selection})
        start.attach(tiny_model(), task, log=lambda m: None, measure=False)


# -- defect 3: the training log belongs to one run --------------------------------------------------------------

def test_the_training_log_starts_afresh_for_a_new_run_and_continues_a_resumed_ones_steps(tmp_path):
    import csv

    import hetprune_logger

    def rows():
        return [(r["stage"], r["step"]) for r in csv.DictReader((tmp_path / hetprune_logger.CSV_FILE).open())]

    events = tmp_path / "tensorboard" / "events.out.tfevents.1.host"
    first = hetprune_logger.TrainingLog()
    first.open(str(tmp_path), run="a")
    for epoch in (1, 2):
        first.row("finetune", epoch, {"loss": 1.0})
    first.row("select", 1, {"loss": 1.0})
    events.parent.mkdir()
    events.write_bytes(b"")
    (tmp_path / "tensorboard" / "mine.txt").write_text("kept")
    first.close()
    resumed = hetprune_logger.TrainingLog()   # a new process: --resume
    resumed.open(str(tmp_path), run="b", resume=True)
    resumed.row("finetune", 3, {"loss": 1.0})
    assert rows() == [("finetune", "1"), ("finetune", "2"), ("select", "1"), ("finetune", "3")]
    assert events.is_file()
    fresh = hetprune_logger.TrainingLog()   # --overwrite, or a run started again without --resume
    fresh.open(str(tmp_path), run="c")
    fresh.row("finetune", 1, {"loss": 1.0})
    assert rows() == [("finetune", "1")]
    assert not events.exists() and (tmp_path / "tensorboard" / "mine.txt").is_file()   # only its own files go
    fresh.open(str(tmp_path / "row2"), run="c")   # a run moving between folders continues in each
    fresh.open(str(tmp_path), run="c")
    fresh.row("finetune", 2, {"loss": 1.0})
    assert rows() == [("finetune", "1"), ("finetune", "2")]


def test_a_runs_stage_events_say_which_run_it_is_and_whether_it_resumes(tmp_path):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    seen = []

    class Watch:
        @hetprune.hookimpl
        def on_stage_start(self, stage, info):
            seen.append((info["run"], info["resume"]))

    name = hetprune.register_plugin(Watch(), "watch-stages")
    try:
        for resume in (False, True):
            hetprune.prune(tiny_model(), tiny_data(), strategy="act-only", budget=1,
                           settings={**TINY_SETTINGS, "scorer": "magnitude"}, out=tmp_path / "out", resume=resume,
                           overwrite=True, progress=False, log=lambda m: None)
    finally:
        hetprune.unregister_plugin(name)
    first, second = [s for s in seen if not s[1]], [s for s in seen if s[1]]
    assert first and second and seen == first + second
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0][0] != second[0][0]   # one id per run


# -- defect 4: --plan-probe without --plan is refused, as --reduce-range without --quantize ---------------------

@pytest.mark.parametrize("command", ["prune", "compare", "ablate"])
def test_plan_probe_without_plan_is_refused_before_anything_is_built(command, capsys, tmp_path, monkeypatch):
    import importlib

    from hetprune.cli import main

    def built(*args, **kwargs):
        raise AssertionError("the base model was built before the refusal")

    importlib.import_module(f"hetprune.cli.commands.{command}_cmd")
    monkeypatch.setattr(importlib.import_module("hetprune.cli.commands.common"), "base_model", built)
    budget = ["--budget", "2"]
    assert main([command, *budget, "--plan-probe", "5", "--out", str(tmp_path / "out")]) == 2
    assert "error: --plan-probe 5.0 times the training step for a plan: give it with --plan" in capsys.readouterr().err


def test_plan_probe_without_plan_is_refused_in_python_too(monkeypatch):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    no_training(monkeypatch)
    for run in (lambda: hetprune.prune(tiny_model(), tiny_data(), "act-only", 1, settings=TINY_SETTINGS,
                                       plan_probe=5),
                lambda: hetprune.compare(tiny_model(), tiny_data(), ["act-only"], [1], settings=TINY_SETTINGS,
                                         plan_probe=5)):
        with pytest.raises(HetpruneError, match="plan_probe=5 times the training step for a plan: give it with "
                                                "plan=True"):
            run()


# -- defect 5: a checks budget too small for its candidates is refused before any point trains --------------------

PIPELINE_CHECKS = {"scorer": "gate-taylor",
                   "hetdpt": {"checks_options": {"spread": {"count": 3, "unit": "finetunes", "budget": 0.01}}}}


def test_a_checks_budget_that_cannot_pay_for_its_candidates_is_refused_before_any_point_trains(monkeypatch,
                                                                                              tmp_path):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    no_training(monkeypatch)
    words = r"hetdpt.checks_options.spread.budget 0.01 .* does not pay for the 3 candidates' selections \(at least "
    for plan in (False, True):
        with pytest.raises(HetpruneError, match=words):
            hetprune.prune(tiny_model(), tiny_data(), "hetdpt", 4, settings={**TINY_SETTINGS, **PIPELINE_CHECKS},
                           plan=plan, plan_probe=0 if plan else None, progress=False, log=lambda m: None)
    # a compare refuses it before its first row (a baseline that would train at once) runs
    with pytest.raises(HetpruneError, match=words):
        hetprune.compare(tiny_model(), tiny_data(), ["act-only", "hetdpt"], [4], out=tmp_path / "cmp",
                         settings={**TINY_SETTINGS, **PIPELINE_CHECKS}, batch_sizes=[1], progress=False,
                         log=lambda m: None)


def test_the_floor_under_the_checks_selections_never_exceeds_what_any_candidates_cost(tmp_path):
    """The early refusal may only refuse what the late one would: its floor is at most the cost of every set of
    candidates the predictor could pick, in any order."""
    import itertools

    from hetprune_hetdpt.halving import PipelineChecks

    job = tiny_job(Budget(sites=4), tmp_path, hetdpt(), {"scorer": "gate-taylor"})
    checks, pairs = PipelineChecks(job), job.feasible_pairs()
    for k in (2, 3):
        floor = checks.least_selections_cost(pairs, k)
        costs = [checks.selections_cost(list(c)) for c in itertools.permutations(pairs, k)]
        assert 0 < floor <= min(costs)


# -- defect 8: kd_token on a student without a distillation token, refused before stage 1 and by --plan ----------

@pytest.mark.parametrize("section", ["finetune", "short_finetune"])
def test_kd_token_on_a_model_without_a_distillation_token_is_refused_before_stage_1_and_by_plan(section,
                                                                                               monkeypatch):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    no_training(monkeypatch)
    settings = {**TINY_SETTINGS, "scorer": "gate-taylor", section: {**TINY_SETTINGS[section], "kd_token": True}}
    for plan in (False, True):
        with pytest.raises(HetpruneError, match=rf"^{section}.kd_token distils into a distillation token, and "
                                                "VisionTransformer has none"):
            hetprune.prune(tiny_model(), tiny_data(), "act-only", 2, settings=settings, plan=plan,
                           plan_probe=0 if plan else None, progress=False, log=lambda m: None)


# -- suspect 2: a checks option where it would do nothing is refused, not silently inert -------------------------
# (issue 71: the old flags were refused one by one by hand; a policy's options now exist only where they act)

@pytest.mark.parametrize("policy, option, words", [
    ("none", {"budget": 4000}, "hetdpt.checks_options gives options of spread, and hetdpt.checks is none"),
    ("points", {"budget": 4000}, r"hetdpt.checks_options.points has no option\(s\) budget"),
    ("points", {"selection": 0.5}, r"hetdpt.checks_options.points has no option\(s\) selection"),
    ("points", {"selection_at_least": 500}, r"hetdpt.checks_options.points has no option\(s\) selection_at_least"),
    ("all", {"count": 3}, r"hetdpt.checks_options.all has no option\(s\) count")])
def test_the_checks_options_are_refused_where_they_would_do_nothing(policy, option, words):
    from hetprune.core import loader

    given = {policy: option} if policy != "none" else {"spread": option}
    with pytest.raises(HetpruneError, match=words):
        loader.resolve(hetdpt(), overrides={"hetdpt": {"checks": policy, "checks_options": given}})
    if "count" not in option:   # taken by the policy they act on
        loader.resolve(hetdpt(), overrides={"hetdpt": {"checks": "spread", "checks_options": {"spread": option}}})
    loader.resolve(hetdpt(), overrides={"hetdpt": {"checks": policy}})   # the policy alone: no error


def test_a_selection_floor_that_cannot_act_or_is_no_number_of_images_is_refused():

    def spread(**options):
        return {"hetdpt": {"checks_options": {"spread": options}}}

    floor = "hetdpt.checks_options.spread.selection_at_least must be a whole number of images per gate epoch >= 1, or null"
    for bad, words in (({"selection": 1, "selection_at_least": 500},
                        r"hetdpt.checks_options.spread.selection_at_least \(500\) is a floor under a share of the "
                        r"scoring subset \(selection below 1\), and selection is 1"),
                       ({"selection": 120, "selection_at_least": 500},
                        "selection is 120 images per gate epoch, a number the floor leaves as it is"),
                       ({"selection_at_least": 0}, floor), ({"selection_at_least": 2.5}, floor),
                       ({"selection_at_least": "many"}, floor)):
        with pytest.raises(HetpruneError, match=words):
            loader.resolve(hetdpt(), overrides=spread(**bad))
    loader.resolve(hetdpt(), overrides=spread(selection_at_least=500))   # under the 0.07 default
    # the default floor (300) beside a selection it leaves alone is no conflict: only a floor the user set is
    for given in (1, 120):
        assert loader.resolve(hetdpt(), overrides=spread(selection=given))["hetdpt"]["checks_options"] == {
            "spread": {"selection": given}}


# -- suspect 3: a strategy's section without that strategy in the run says so -----------------------------------

def test_a_section_of_a_strategy_not_in_the_run_is_refused_naming_that_strategy(capsys):
    from hetprune.cli import main

    assert main(["compare", "--strategies", "act-only,mix50", "--set", "hetdpt.checks=best", "--plan"]) == 2
    err = capsys.readouterr().err
    assert "error: settings section 'hetdpt' in --set options belongs to strategies hetdpt, hetdpt-plus, none of " \
           "which is among this run's strategies (act-only, mix50)" in err
    assert main(["prune", "--strategy", "act-only", "--budget", "2", "--set", "hetdpt_plus.depth_share=0.5",
                 "--plan"]) == 2
    assert "'hetdpt_plus' in --set options belongs to strategy hetdpt-plus, which is not among this run's " \
           "strategies (act-only)" in capsys.readouterr().err


# -- defect 6: a point scorer's options reach it, and key its points ------------------------------------------

def test_a_point_scorers_options_reach_it_and_key_the_points(tmp_path):
    from hetprune_hetdpt.point_schemes import OneShotPoints
    from hetprune_hetdpt.progressive import ProgressivePoints, paths_for

    def scheme(cls, seed):
        options = {} if seed is None else {"scorer_options": {"random": {"seed": seed}}}
        job = tiny_job(Budget(sites=4), tmp_path / f"{cls.__name__}{seed}", hetdpt(),
                       {"hetdpt": {"point_scorer": "random"}, **options})
        return cls(job, hetdpt())

    def key(made):   # a one-shot point's key; a progressive path's
        if isinstance(made, ProgressivePoints):
            return made.path_key(paths_for(made.job.feasible_pairs(), made.first, made.stride)[0])
        return made.key

    orders = {seed: str(scheme(OneShotPoints, seed).orders({"attn": 4, "act": 4})) for seed in (1, 2, 3)}
    assert len(set(orders.values())) > 1                            # the seed reaches the point scorer
    for cls in (OneShotPoints, ProgressivePoints):
        assert len({key(scheme(cls, seed)) for seed in (None, 1, 2)}) == 3   # and keys the points
    assert scheme(OneShotPoints, None).point_scorer_key == {"point_scorer": "random"}   # no options: keys kept


# -- defect 7: a teacher without pretrained weights is the same on every run, so --resume keeps its fine-tune -----

def test_a_teacher_built_without_weights_is_the_same_whatever_random_state_the_run_is_in(tmp_path):
    def teacher(folder, global_seed, seed=0):
        job = tiny_job(Budget(sites=2), tmp_path / folder, settings={"seed": seed, "finetune": TEACHER})
        torch.manual_seed(global_seed)   # what ran before (a base model trained, a gate phase) moved the state
        key = job.teacher_for(job.train_config("finetune"))[1]
        untouched = torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(global_seed)))
        return key, untouched

    (first, untouched), (resumed, _) = teacher("a", 1), teacher("b", 2)
    assert first == resumed          # the resumed run's fine-tune checkpoint keeps its key
    assert teacher("c", 1, seed=1)[0] != first   # seeded by the run's seed
    assert untouched                 # and the run's own random state goes on as it was


# -- everything that can be refused is refused before stage 1 -------------------------------------------------

@pytest.mark.parametrize("schedule, words", [({"mixup": 0.8}, "short_finetune: mixup act on hetprune's own"),
                                             ({"accum_steps": 2}, "short_finetune: accum_steps > 1 cuts hetprune's")])
def test_schedule_options_a_tasks_own_batches_cannot_take_are_refused_before_anything_trains(schedule, words,
                                                                                           monkeypatch):
    """A user's Task on hetprune's trainer: options that need hetprune's (images, labels) batches were refused
    at the first fine-tune on that schedule, after the gate phase had trained."""
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    no_training(monkeypatch)
    settings = {**TINY_SETTINGS, "scorer": "gate-taylor",
                "short_finetune": {**TINY_SETTINGS["short_finetune"], **schedule}}
    with pytest.raises(HetpruneError, match=words):
        hetprune.prune(tiny_model(), task_with_selection(tiny_data(), True), "hetdpt", 2, settings=settings,
                       progress=False, log=lambda m: None)


def test_a_point_scorer_without_a_one_shot_score_is_refused_before_anything_trains(monkeypatch, tmp_path):
    import hetprune
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    class SelectOnly:
        name = "select-only"

        def select(self, model, counts, ctx):
            return []

    from conftest import PluginOf

    name = hetprune.register_plugin(PluginOf("register_scorers", SelectOnly), "select-only-scorer")
    no_training(monkeypatch)
    try:
        with pytest.raises(HetpruneError, match="hetdpt.point_scorer 'select-only' has no one-shot score"):
            hetprune.compare(tiny_model(), tiny_data(), ["act-only", "hetdpt"], [2], progress=False,
                             settings={**TINY_SETTINGS, "hetdpt": {"point_scorer": "select-only"}},
                             batch_sizes=[1], log=lambda m: None, out=tmp_path / "cmp")
    finally:
        hetprune.unregister_plugin(name)


def test_a_run_scorer_that_breaks_its_protocol_is_refused_before_any_point_as_plan_refuses_it(monkeypatch, tmp_path):
    """Issue 71: an outside scorer with neither score() nor select() was refused by name at --plan, but a real
    run measured every MAP point first (the pre-flight never built the scorer the checks use). The pre-flight is
    now the run's own plan, so both refuse it before anything trains."""
    import hetprune
    from hetprune import PluginError
    from hetprune.harness.testing import TINY_SETTINGS, tiny_data, tiny_model

    class Hollow:
        name = "hollow"

    from conftest import PluginOf

    name = hetprune.register_plugin(PluginOf("register_scorers", Hollow), "hollow-scorer")
    no_training(monkeypatch)
    settings = {**TINY_SETTINGS, "scorer": "hollow", "hetdpt": {"checks_options": {"spread": {"count": 2}}}}
    try:
        for plan in (True, False):
            with pytest.raises(PluginError, match=r"scorer 'hollow' lacks .*score\(\)"):
                hetprune.prune(tiny_model(), tiny_data(), "hetdpt", 2, settings=settings, plan=plan,
                               plan_probe=0 if plan else None, progress=False, log=lambda m: None)
    finally:
        hetprune.unregister_plugin(name)
