"""Honest speed columns: every speedup carries its spread (rounds go on until it is known within the target),
models with the same structure are timed once, overlapping speedups are a tie, and a comparison says when
its timing cannot be trusted."""

from __future__ import annotations

import json
import statistics

import pytest

import hetprune
from hetprune import bench
from hetprune.harness.compare.report import aggregate, speed_notes, untrusted_timing, write_outputs
from hetprune.harness.compare import CompareSpec
from hetprune.harness.compare.timing import attach_speed, measure_rows
from hetprune.model.recipe import save


class Scripted:
    """A runner whose per-call times are given: ``time`` returns the next one (warm-up calls included)."""

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def time(self, number):
        self.calls += 1
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def hand_spread(dense, model):
    ratios = [a / b for a, b in zip(dense, model)]
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return (q[2] - q[0]) / 2 / statistics.median(ratios)


def test_rounds_go_on_until_the_ratio_is_known_within_the_target():
    jitter = [0.5, 0.62, 0.41, 0.55, 0.44, 0.52, 0.47]              # the first seven rounds: a noisy neighbour
    dense = Scripted([1.0])
    model = Scripted([0.5, 0.5, *jitter, *[0.5] * 200])            # warm-up and calibration calls, then rounds
    out = bench.time_interleaved({"dense": dense, "m": model}, repeats=7, warmup=1, min_time_s=0.0,
                                 reference="dense", spread_target=0.02)
    rounds = out["m"]["rounds"]
    assert 7 < rounds < 60                                          # went on, and stopped once it was known
    runs_m = out["m"]["latency_s"]["runs"]
    assert runs_m[:7] == jitter
    assert out["m"]["ratio_spread"] == pytest.approx(hand_spread([1.0] * rounds, runs_m))
    assert out["m"]["ratio_spread"] <= 0.02
    assert hand_spread([1.0] * (rounds - 1), runs_m[:-1]) > 0.02    # one round fewer was not enough


def test_the_extra_rounds_stop_at_the_time_budget():
    now = {"t": 0.0}

    class Clocked(Scripted):   # each call takes half a second of the (fake) clock: a round is one second
        def time(self, number):
            now["t"] += 0.5
            return super().time(number)

    model = Clocked([0.5, 0.5, *[0.4, 0.6] * 300])                  # never settles
    out = bench.time_interleaved({"dense": Clocked([1.0]), "m": model}, repeats=5, warmup=1, min_time_s=0.0,
                                 reference="dense", spread_target=0.02, spread_budget_s=3, clock=lambda: now["t"])
    assert out["m"]["rounds"] == 5 + 3                              # three one-second rounds past the first five
    assert out["m"]["ratio_spread"] > 0.02                          # and it says how well it is known
    no_target = bench.time_interleaved({"dense": Scripted([1.0]), "m": Scripted([0.5, 0.4, 0.6] * 10)}, repeats=5,
                                       warmup=1, min_time_s=0.0)
    assert no_target["m"]["rounds"] == 5 and "ratio_spread" not in no_target["m"]


def test_bench_prints_each_speedup_with_its_spread(tiny_model):
    import copy

    other = copy.deepcopy(tiny_model)
    hetprune.model.surgery.remove_activation(other, 1)
    result = bench.measure({"dense": tiny_model, "pruned": other}, input_shape=(1, 16, 16), batch_sizes=[2],
                           device="cpu", repeats=3, warmup=1, min_time_s=0.001)
    row = next(r for r in result["results"] if r["model"] == "pruned")
    assert row["speedup_spread"] == pytest.approx(hand_spread(
        next(r for r in result["results"] if r["model"] == "dense")["latency_s"]["runs"], row["latency_s"]["runs"]))
    assert f"±{row['speedup_spread']:.1%}" in bench.format_table(result)


def saved(tmp_path, name, model, recipe):
    folder = tmp_path / "models" / name
    save(folder, model, recipe)
    return {"id": name, "model_dir": f"models/{name}"}


def test_models_with_the_same_structure_are_timed_once_and_share_the_figure(tiny_model, tiny_spec, tmp_path,
                                                                             monkeypatch):
    import copy

    from hetprune.model.recipe import arch_of, recipe_from_model

    def pruned(act, seed_shift):
        m = copy.deepcopy(tiny_model)
        for p in m.parameters():   # other weights: only the structure is the same
            p.data.add_(seed_shift)
        hetprune.model.surgery.remove_activation(m, act)
        return m, recipe_from_model(m, tiny_spec, arch_of(tiny_model))

    rows = [saved(tmp_path, "hetdpt__sites1__seed0", *pruned(1, 0.0)),
            saved(tmp_path, "act-only__sites1__seed0", *pruned(1, 0.01)),
            saved(tmp_path, "mix__sites1__seed0", *pruned(2, 0.0))]
    timed = {}

    def fake_measure(models, **kw):
        timed.update(models)
        res = [{"model": n, "batch_size": 2, "throughput_img_s": 10.0 * (i + 1), "speedup": 1.0 + 0.5 * i,
                "speedup_spread": 0.01, "mac_ratio": 1.2} for i, n in enumerate(models)]
        return {"results": res, "environment": {}}

    monkeypatch.setattr(hetprune.measure.bench, "measure", fake_measure)
    spec = CompareSpec(["hetdpt", "act-only", "mix"], [hetprune.Budget(sites=1)], [0], {}, batch_sizes=[2])
    timing = measure_rows(spec, tiny_model, rows, tmp_path, (1, 16, 16), log=lambda m: None, model_spec=tiny_spec)
    assert sorted(timed) == ["dense", "hetdpt__sites1__seed0", "mix__sites1__seed0"]   # act-only: not again
    dense_row = {"metric": 90.0, "macs": 1, "params": 1}
    attach_speed(rows, dense_row, timing)
    assert rows[0]["speedup_large"] == rows[1]["speedup_large"] != rows[2]["speedup_large"]
    assert rows[1]["timed_as"] == "hetdpt__sites1__seed0"
    for r, strategy in zip(rows, ("hetdpt", "act-only", "mix")):
        r.update(strategy=strategy, budget={"sites": 1}, n_attn=0, n_act=1, metric=90.0, macs=1, params=1)
    notes = {a["strategy"]: a["speed_note"] for a in aggregate(rows)}
    assert notes == {"hetdpt": "same model as act-only", "act-only": "same model as hetdpt", "mix": ""}


def test_speedups_that_overlap_within_their_spreads_are_a_tie():
    def agg(name, speedup, spread, std=0.0):
        return {"strategy": name, "budget": {"sites": 4}, "structures": [f"{name}"], "speedup_large": speedup,
                "speedup_large_spread": spread, "speedup_large_std": std}

    aggs = [agg("a", 1.50, 0.02), agg("b", 1.55, 0.02), agg("c", 1.80, 0.01), agg("d", 1.70, 0.0, std=0.12)]
    notes = dict(zip("abcd", speed_notes(aggs)))
    # a: 1.47-1.53, b: 1.519-1.581, c: 1.782-1.818, d: 1.58-1.82 (its seeds spread more than its timing)
    assert notes == {"a": "speed tie with b", "b": "speed tie with a, d", "c": "speed tie with d",
                     "d": "speed tie with b, c"}


def test_a_comparison_says_when_its_timing_cannot_be_trusted(tmp_path):
    import os

    cores = os.cpu_count() or 1
    fine_rows = [{"speedup_large": 1.8, "mac_ratio_large": 2.0}, {"speedup_large": 1.3, "mac_ratio_large": 1.4}]
    quiet = {"environment": {"load_start": [0.3, 0.3, 0.3], "load_end": [0.4, 0.3, 0.3]}}
    assert untrusted_timing(quiet, fine_rows) == []
    loaded = {"environment": {"load_start": [cores * 2.0, 1, 1], "load_end": [cores * 1.5, 1, 1]}}
    [why] = untrusted_timing(loaded, fine_rows)
    assert f"load average was {cores * 1.5:.1f}-{cores * 2.0:.1f} on {cores} cores" in why
    own = {"environment": {"load_start": [cores * 1.01, 1, 1], "load_end": [cores * 1.1, 1, 1]}}
    assert untrusted_timing(own, fine_rows) == []   # the timing's own threads keep every core busy
    tiny = [{"speedup_large": 1.05, "mac_ratio_large": 2.3}, {"speedup_large": 0.9, "mac_ratio_large": 2.0}]
    [why] = untrusted_timing(quiet, tiny)
    assert "far from the MAC ratio (45%-46% of it)" in why
    assert len(untrusted_timing(quiet, [*tiny, fine_rows[0]])) == 0   # one row that agrees: overheads do not rule

    spec = CompareSpec(["x"], [hetprune.Budget(sites=1)], [0], {}, batch_sizes=[1, 2])
    rows = [{**r, "id": "x", "strategy": "x", "budget": {"sites": 1}, "seed": 0, "n_attn": 0, "n_act": 1,
             "sites": ["act1"], "metric": 80.0, "metric_before_finetune": 70.0, "metric_name": "top1", "macs": 1,
             "params": 1, "speedup_large_spread": 0.01} for r in tiny]
    written = write_outputs(tmp_path, spec, {"metric": 90.0, "macs": 2, "params": 2, "large_batch": 2}, rows[:1],
                            quiet, {"metric_name": "top1"})
    assert "Timing cannot be trusted here" in written["markdown"]
    assert "Timing cannot be trusted here" in (tmp_path / "results.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["untrusted_timing"]
