"""A stored result (MAP points, checks, checkpoints, compare rows) is reused only when everything that shaped
it is the same, and a run that reuses one says so, with when it was made (issue 40, items 1-3 and the
suspected progressive-checkpoint, point-scorer and results-file items)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

import hetprune
from hetprune import HetpruneError, Task
from hetprune.pruning.budget import Budget
from hetprune.model.spec import ModelSpec, build
from hetprune.training.resume import base_key, code_key, config_key
from hetprune.harness.testing import TINY_SETTINGS
from conftest import TINY_KWARGS, TINY_SPEC

# hetdpt on a tiny model, as fast as it goes: the default (one-shot) points on 1-epoch fine-tunes, no checks
HETDPT = {**TINY_SETTINGS, "scorer": "magnitude", "hetdpt": {"checks": "none", "point_scorer": "magnitude"}}
# the keying tests run with both kinds of points that fine-tune: the default and the paper's progressive paths
SCHEMES = pytest.mark.parametrize("scheme", ["oneshot", "progressive"])


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def top1(model, val):
    hits = total = 0
    for x, y in val:
        hits += int((model(x).argmax(-1) == y).sum())
        total += len(y)
    return 100.0 * hits / total


@torch.no_grad()
def top1_error(model, val):   # the same name below: only the code tells the two apart
    hits = total = 0
    for x, y in val:
        hits += int((model(x).argmax(-1) == y).sum())
        total += len(y)
    return 100.0 - 100.0 * hits / total


def task(digits_data, **changes) -> Task:
    parts = dict(train=DataLoader(Subset(digits_data.train, range(64)), batch_size=16),
                 val=DataLoader(Subset(digits_data.val, range(64)), batch_size=32),
                 loss=ce, metric=top1, metric_name="top-1", name="digits-in-code")
    return Task(**{**parts, **changes})


def model(**kwargs):
    torch.manual_seed(0)
    return build(ModelSpec(TINY_SPEC.name, {**TINY_KWARGS, **kwargs}))


def run(m, t, out, log, scheme="oneshot", **kwargs):
    settings = copy.deepcopy(HETDPT)
    settings["hetdpt"]["point_selection"] = scheme
    return hetprune.prune(m, t, strategy="hetdpt", budget=2, settings=settings, out=out, progress=False,
                          log=log.append, **kwargs)


def points_file(out):
    return [json.loads(line) for line in (out.parent / f"{out.name}.work" / "map-points.jsonl").read_text()
            .splitlines() if line.strip()]


def measured(report) -> dict:
    return {(p["n_attn"], p["n_act"]): p["metric"] for p in report["allocation"]["points"]}


@SCHEMES
def test_a_changed_metric_measures_its_points_again_and_picks_by_the_new_direction(digits_data, tmp_path, scheme):
    out, first, second = tmp_path / "r", [], []
    a = run(model(), task(digits_data), out, first, scheme)
    b = run(model(), task(digits_data, metric=top1_error, higher_is_better=False), out, second, scheme,
            overwrite=True)
    assert not any("reusing" in line for line in second), second
    # the very same models, measured with the new metric: every point is the old one's error
    points_a, points_b = measured(a.report), measured(b.report)
    assert points_a.keys() == points_b.keys()
    assert all(points_b[p] == pytest.approx(100.0 - points_a[p]) for p in points_a)
    assert len({p["key"] for p in points_file(out)}) >= 2
    assert b.report["metric"] == pytest.approx(100.0 - a.report["metric"])   # the same split, the same model


@SCHEMES
def test_a_changed_model_configuration_measures_its_points_again(digits_data, tmp_path, scheme):
    out, first, second = tmp_path / "r", [], []
    plain = model()
    run(plain, task(digits_data), out, first, scheme)
    noisy = model(drop_path_rate=0.5, proj_drop_rate=0.5)
    noisy.load_state_dict(plain.state_dict())     # the same weights, another configuration
    assert hetprune.model.spec.model_hash(noisy) == hetprune.model.spec.model_hash(plain)
    run(noisy, task(digits_data), out, second, scheme, overwrite=True)
    assert not any("reusing" in line for line in second), second
    keys = [p["key"] for p in points_file(out)]
    assert len(set(keys)) > len(set(keys[:len(keys) // 2]))   # the second run's points under keys of their own


@SCHEMES
def test_a_run_that_reuses_every_point_says_what_and_when(digits_data, tmp_path, scheme):
    out, first, second = tmp_path / "r", [], []
    a = run(model(), task(digits_data), out, first, scheme)
    b = run(model(), task(digits_data), out, second, scheme, overwrite=True)
    n = len(a.report["allocation"]["points"])
    said = [line for line in second if "reusing" in line]
    assert len(said) == 1, second
    day = points_file(out)[0]["measured_at"][:10]
    assert f"reusing {n} of {n} MAP points measured {day}" in said[0] and "map-points.jsonl" in said[0]
    assert measured(b.report) == measured(a.report)


def test_code_keys_follow_the_source_the_closure_and_the_globals_a_function_reads():
    def make(threshold):
        def metric(model, val):
            return threshold
        return metric

    assert code_key(make(1))[0] != code_key(make(2))[0]          # a value it closes over
    assert code_key(top1)[0] != code_key(top1_error)[0]          # its source
    assert code_key(top1)[0] == code_key(top1)[0] and code_key(top1)[1] == []
    import functools

    assert code_key(functools.partial(ce))[0] != code_key(functools.partial(top1))[0]
    assert code_key(torch.nn.CrossEntropyLoss(label_smoothing=0.1))[0] != \
        code_key(torch.nn.CrossEntropyLoss())[0]


def test_code_without_source_is_reused_only_when_resume_asks_and_says_so(digits_data, tmp_path):
    namespace: dict = {}
    exec("def metric(model, val):\n    return 50.0\n", namespace)   # like code typed at a prompt: no source file
    unreadable = namespace["metric"]
    unreadable.__module__ = "__main__"
    t = task(digits_data, metric=unreadable)
    assert t.unreadable == ["metric __main__.metric"]
    out, first, second, third = tmp_path / "r", [], [], []
    run(model(), t, out, first)
    assert any("no source hetprune can read" in line and "not reused" in line for line in first)
    t2 = task(digits_data, metric=unreadable)
    run(model(), t2, out, second, overwrite=True)
    assert not any("reusing" in line for line in second), second
    t3 = task(digits_data, metric=unreadable)
    run(model(), t3, out, third, overwrite=True, resume=True)
    assert any("reusing them because resume=True asks for it" in line for line in third)
    assert any("reusing" in line and "MAP points" in line for line in third)


def test_the_base_key_covers_the_configuration_not_only_the_weights():
    plain, noisy = model(), model(drop_path_rate=0.5)
    noisy.load_state_dict(plain.state_dict())
    assert config_key(plain) != config_key(noisy)
    h = hetprune.model.spec.model_hash(plain)
    assert base_key(plain, h) != base_key(noisy, h)
    assert base_key(plain, h) == base_key(model(), h)   # stable for the same model


def test_a_bad_point_scorer_is_refused_before_any_point_is_measured(digits_data, tmp_path):
    calls = []

    def counted(model, val):
        calls.append(1)
        return top1(model, val)

    settings = copy.deepcopy(HETDPT)
    settings["hetdpt"]["point_scorer"] = "no-such-scorer"
    with pytest.raises(HetpruneError, match=r"setting hetdpt.point_scorer: no scorer named 'no-such-scorer'"):
        hetprune.prune(model(), task(digits_data, metric=counted), strategy="hetdpt", budget=2, settings=settings,
                       progress=False, log=lambda m: None)
    assert calls == []


def test_a_budget_is_written_in_a_command_line_as_the_call_passes_it():
    assert repr(Budget(sites=2).as_argument()) == "2"
    assert repr([Budget(target_macs=0.5).as_argument()]) == "[Budget(target_macs=0.5)]"


def test_a_progressive_step_is_never_continued_from_weights_of_another_removal_order(tmp_path):
    from hetprune.harness.testing import tiny_job
    from hetprune_hetdpt.paths import Path as PointPath
    from hetprune_hetdpt.progressive import ProgressivePoints
    from hetprune_hetdpt.strategy import HetDPT

    job = tiny_job(Budget(sites=3), tmp_path, strategy_defaults=HetDPT.defaults,
                   settings={"hetdpt": {"checks": "none", "point_scorer": "magnitude"}})
    scheme = ProgressivePoints(job, HetDPT())
    a, b = PointPath("interleaved-act-first"), PointPath("interleaved-act-first")
    for kinds in (["act"], ["attn"], ["act"]):
        a.take(kinds)
    for kinds in (["act"], ["act"], ["attn"]):
        b.take(kinds)
    assert scheme.path_key(a) == scheme.path_key(b)
    assert scheme.checkpoint(a, 1) == scheme.checkpoint(b, 1)   # the same first removal
    assert scheme.checkpoint(a, 2) != scheme.checkpoint(b, 2)   # 1+1 against 0+2 after two steps
    # a kept step whose sites are not the step's (a file from before names held the order) is not continued
    from hetprune.model.sites import Site

    wrong = [Site(0, "act"), Site(1, "act")]
    m = copy.deepcopy(job.dense)
    hetprune.pruning.pipeline.remove_sites(job, m, wrong)
    scheme.keep(m, wrong, scheme.checkpoint(a, 2))
    said = []
    job.log = said.append
    _, removed, step = scheme.start(a, stored={})
    assert step == 0 and removed == [] and any("not reused" in line for line in said)
