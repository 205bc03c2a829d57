"""The speed harness (hetprune.measure.bench) and `hetprune bench`: structure and
sanity only; no test asserts on a timing value."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import hetprune
from hetprune import bench
from hetprune.model import surgery
from hetprune.cli import main
from hetprune.core.errors import HetpruneError
from hetprune.model.recipe import arch_of, recipe_from_model

from conftest import TINY_KWARGS

SHAPE = (1, 16, 16)
FAST = ["--device", "cpu", "--repeats", "2", "--warmup", "1", "--min-time", "0", "--threads", "1"]


@pytest.fixture
def pruned_dir(tiny_model, tiny_spec, tmp_path):
    """A saved pruned tiny model: attention of block 1 gone, block 2's MLP linear and merged."""
    arch = arch_of(tiny_model)
    surgery.remove_attention(tiny_model, 1)
    surgery.remove_activation(tiny_model, 2)
    surgery.merge_mlp(tiny_model, 2)
    recipe = recipe_from_model(tiny_model, tiny_spec, arch)
    return hetprune.save(tmp_path / "pruned", tiny_model, recipe)


def Recorder(model: nn.Module, name: str, calls: list) -> nn.Module:
    """``model``, appending ``name`` to a shared list on every call (a hook: still a model hetprune knows)."""
    model.register_forward_pre_hook(lambda module, inputs: calls.append(name))
    return model


def test_bench_saved_folder_against_dense_base(pruned_dir, tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert main(["bench", str(pruned_dir), "--batch-sizes", "1,2", "--json", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "MAC ratio" in printed
    result = json.loads(out.read_text())
    env = result["environment"]
    assert env["torch"] == torch.__version__
    assert env["device"] == "cpu" and env["device_name"] and env["threads"] == 1 and env["dtype"] == "fp32"
    assert "load_start" in env and "load_end" in env
    assert result["reference"] == "vit_tiny_patch16_224 (dense)"
    assert result["macs_convention"] == hetprune.model.macs.CONVENTION
    assert result["settings"]["interleaved"] is True
    assert len(result["results"]) == 4  # 2 models x 2 batch sizes
    for row in result["results"]:
        assert row["batch_size"] == row["requested_batch_size"] in (1, 2)
        assert row["throughput_img_s"] > 0 and row["speedup"] > 0 and row["paired_speedup"]["median"] > 0
        assert row["latency_s"]["min"] <= row["latency_s"]["median"] <= row["latency_s"]["max"]
        assert len(row["latency_s"]["runs"]) == 2
        for key in ("dtype", "device", "threads", "params", "macs", "load_start", "load_end"):
            assert key in row
    pruned = [r for r in result["results"] if r["model"] == "pruned"]
    dense = [r for r in result["results"] if r["model"] != "pruned"]
    assert all(r["mac_ratio"] > 1 and r["macs"] < dense[0]["macs"] for r in pruned)
    assert all(r["mac_ratio"] == 1 and r["speedup"] == 1 for r in dense)
    assert result["command"]["recipe"]["attn_removed"] == [1]


def test_bench_timm_name(capsys):
    args = ["bench", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY_KWARGS), "--batch-sizes", "2",
            "--markdown", *FAST]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| model | batch |" in printed and "img/s" in printed
    assert "speedup" not in printed.split("| model")[1].splitlines()[0]  # one model: no speedup column


def test_bench_name_against_folder(pruned_dir, tmp_path):
    out = tmp_path / "r.json"
    args = ["bench", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY_KWARGS), "--against",
            str(pruned_dir), "--batch-sizes", "1", "--json", str(out), *FAST]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["reference"] == "pruned"
    assert [r["model"] for r in result["results"]] == ["pruned", "vit_tiny_patch16_224"]


def test_models_are_timed_interleaved(tiny_model, tiny_spec):
    calls: list[str] = []
    torch.manual_seed(1)
    other = hetprune.model.spec.build(tiny_spec)
    surgery.remove_attention(other, 0)
    models = {"a": Recorder(tiny_model, "a", calls), "b": Recorder(other, "b", calls)}
    result = bench.measure(models, SHAPE, [1, 3], device="cpu", repeats=3, warmup=2, min_time_s=0)
    # one call counts the MACs; per batch size, 2 warm-up calls (the second calibrates) and 3 repeats
    assert calls.count("a") == calls.count("b") == 1 + 2 * (2 + 3)
    assert all(x != y for x, y in zip(calls, calls[1:])), f"not interleaved: {calls}"
    assert [(r["model"], r["batch_size"]) for r in result["results"]] == [("a", 1), ("b", 1), ("a", 3), ("b", 3)]
    assert result["reference"] == "a"


def test_measure_restores_threads_and_bf16_on_cpu(tiny_model):
    before = torch.get_num_threads()
    result = bench.measure({"m": tiny_model}, SHAPE, [2], device="cpu", dtype="bf16", repeats=1, warmup=0,
                           min_time_s=0, threads=1)
    assert torch.get_num_threads() == before
    row = result["results"][0]
    assert row["dtype"] == "bf16" and row["threads"] == 1 and row["throughput_img_s"] > 0
    assert "speedup" not in row and result["reference"] is None


def test_format_table_markdown_and_terminal(tiny_model):
    result = bench.measure({"x": tiny_model, "y": tiny_model}, SHAPE, [1], device="cpu", repeats=1, warmup=0,
                           min_time_s=0)
    md = bench.format_table(result, markdown=True).splitlines()
    assert md[0].startswith("| model | batch |") and md[1].startswith("|---")
    assert md[md.index(next(line for line in md if not line.startswith("|")))] == ""  # blank line ends the table
    term = bench.format_table(result)
    assert "speedup / MAC ratio" in term and "load average" in term


@pytest.mark.parametrize("argv, message", [
    (["bench", "vit_tiny_patch16_224", "--batch-sizes", "1,x"], "--batch-sizes"),
    (["bench", "vit_tiny_patch16_224", "--batch-sizes", "0"], "--batch-sizes"),
    (["bench", "no_such_model_xyz", "--batch-sizes", "1"], "no model named"),
    (["bench", "vit_tiny_patch16_224", "--model-kwargs", "[1]"], "JSON object"),
])
def test_bench_cli_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_cli_rejects_plain_file_and_empty_folder(tmp_path, capsys):
    (tmp_path / "w.safetensors").write_text("x")
    assert main(["bench", str(tmp_path / "w.safetensors")]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["bench", str(tmp_path)]) == 2
    assert "no recipe.json" in capsys.readouterr().err


def test_bench_cli_mismatched_input_sizes(pruned_dir, capsys):
    kwargs = dict(TINY_KWARGS, img_size=32)
    assert main(["bench", str(pruned_dir), "--against", "vit_tiny_patch16_224", "--model-kwargs",
                 json.dumps(kwargs), *FAST]) == 2
    assert "same input size" in capsys.readouterr().err


def test_measure_errors(tiny_model):
    with pytest.raises(HetpruneError, match="batch sizes"):
        bench.measure({"m": tiny_model}, SHAPE, [], device="cpu")
    with pytest.raises(HetpruneError, match="reference"):
        bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", reference="other")
    with pytest.raises(HetpruneError, match="fp16 on CPU"):
        bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", dtype="fp16")
    with pytest.raises(HetpruneError, match="dtype"):
        bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", dtype="int8")
    with pytest.raises(HetpruneError, match="nothing to measure"):
        bench.measure({}, SHAPE, [1], device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_cuda_without_cuda_is_a_clear_error(tiny_model, capsys):
    with pytest.raises(HetpruneError, match="no CUDA device"):
        bench.measure({"m": tiny_model}, SHAPE, [1], device="cuda")
    assert main(["bench", "vit_tiny_patch16_224", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_bf16_peak_memory_and_oom_halving(device, tiny_model, tiny_spec, monkeypatch):
    """On CUDA: bf16, CUDA events, peak memory, and an out-of-memory batch halved. Its CPU twin runs the same
    calls: the timer is the clock, no device memory, and the simulated OOM is halved the same way."""
    other = hetprune.model.spec.build(tiny_spec)
    surgery.remove_attention(other, 0)
    result = bench.measure({"dense": tiny_model, "pruned": other}, SHAPE, [1, 8], device=device, dtype="bf16",
                           repeats=2, warmup=1, min_time_s=0.01)
    env = result["environment"]
    assert env["device"] == device and env["dtype"] == "bf16" and bool(env.get("gpu")) == (device == "cuda")
    assert result["settings"]["timer"] == ("cuda events" if device == "cuda" else "time.perf_counter")
    for row in result["results"]:
        assert row["throughput_img_s"] > 0 and row["speedup"] > 0
        assert (row["peak_memory_bytes"] or 0) > 0 if device == "cuda" else row["peak_memory_bytes"] is None

    real = bench.timing._time_batch

    def fake(models, shape, batch, *a, **k):
        if batch > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(models, shape, batch, *a, **k)

    monkeypatch.setattr(bench.timing, "_time_batch", fake)
    result = bench.measure({"m": tiny_model}, SHAPE, [8], device=device, repeats=1, warmup=0, min_time_s=0)
    row = result["results"][0]
    assert row["batch_size"] == 2 and row["requested_batch_size"] == 8 and "out of memory" in row["note"]


def test_per_block_splits_each_block_into_its_parts_and_removed_parts_cost_nothing(tiny_model):
    surgery.remove_attention(tiny_model, 1)
    surgery.remove_activation(tiny_model, 2)
    surgery.merge_all(tiny_model)
    surgery.drop_block(tiny_model, 3)
    result = bench.per_block(tiny_model, SHAPE, 4, repeats=3, warmup=1)
    rows = {r["block"]: r for r in result["blocks"]}
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0]["attention_ms"] > 0 and rows[0]["mlp_ms"] > 0
    assert rows[1]["attention_ms"] == 0 and rows[1]["mlp_ms"] > 0          # attention removed
    assert rows[3]["total_ms"] < rows[0]["total_ms"] / 5                    # a dropped block is the identity
    for r in rows.values():
        assert r["attention_ms"] + r["mlp_ms"] + r["other_ms"] == pytest.approx(max(r["total_ms"], r["attention_ms"]
                                                                                     + r["mlp_ms"]), rel=1e-6)
    assert result["model_ms"] >= sum(r["total_ms"] for r in rows.values())
    text = bench.format_per_block("pruned", result)
    assert text.startswith("pruned: where the time goes at batch 4") and "outside the blocks" in text


def test_bench_per_block_on_the_command_line(pruned_dir, capsys):
    from hetprune.cli import main

    assert main(["bench", str(pruned_dir), "--batch-sizes", "2", "--repeats", "2", "--warmup", "1",
                 "--min-time", "0", "--device", "cpu", "--per-block"]) == 0
    out = capsys.readouterr().out
    assert out.count("where the time goes at batch 2") == 2  # the pruned model and its dense base


class _FakeRunner:
    """Reports a fixed time per call and records how many calls each ``time`` was asked for."""

    def __init__(self, seconds: float):
        self.seconds, self.asked = seconds, []

    def time(self, number: int) -> float:
        self.asked.append(number)
        return self.seconds


@pytest.mark.parametrize("warmup, once, long_calls, short_calls", [
    # a short call is calibrated from its second warm-up call, or from a fresh call after a single warm-up
    (2, False, [1, 1, 1, 1, 1], [1, 1, 20, 20, 20]),
    (1, False, [1, 1, 1, 1, 1], [1, 1, 20, 20, 20]),
    # the latency table's warm_long_once: a call as long as a window gets one warm-up and no calibration call
    (2, True, [1, 1, 1, 1], [1, 1, 20, 20, 20]),
    (1, True, [1, 1, 1, 1], [1, 1, 20, 20, 20]),
    (0, True, [1, 1, 1, 1], [1, 20, 20, 20]),
])
def test_interleaved_timing_spends_no_extra_calls(warmup, once, long_calls, short_calls):
    long, short = _FakeRunner(0.5), _FakeRunner(0.01)
    out = bench.time_interleaved({"long": long, "short": short}, repeats=3, warmup=warmup, min_time_s=0.2,
                                 warm_long_once=once)
    assert long.asked == long_calls and short.asked == short_calls
    assert out["long"]["calls_per_repeat"] == 1 and out["short"]["calls_per_repeat"] == 20
    assert out["short"]["latency_s"]["median"] == pytest.approx(0.01)


@pytest.mark.parametrize("seconds, budget, rounds", [
    (0.01, 1.0, 20),     # 5 calls a round (0.05 s): as many rounds as fill a second
    (0.01, 100.0, 60),   # never more than max_repeats
    (0.5, 1.0, 3),       # a call longer than the budget: the rounds asked for, at least
    (0.01, None, 3),     # no budget: exactly the rounds asked for
])
def test_rounds_fill_the_time_budget(seconds, budget, rounds):
    runner = _FakeRunner(seconds)
    out = bench.time_interleaved({"m": runner}, repeats=3, warmup=1, min_time_s=0.05, budget_s=budget,
                                 max_repeats=60)
    assert len(out["m"]["latency_s"]["runs"]) == rounds
    # rounds are the calls after warm-up and calibration, each of calls_per_repeat calls
    assert runner.asked[-rounds:] == [out["m"]["calls_per_repeat"]] * rounds


def test_measure_refuses_a_bad_budget(tiny_model):
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(HetpruneError, match="budget_s"):
            bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", budget_s=bad)


def _onnx_file(path, dims) -> str:
    """A one-node ONNX file whose image input has ``dims`` (a string for a free dimension)."""
    onnx = pytest.importorskip("onnx", reason="the export extra is not installed")
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name in ("pixel_values", "logits")]
    graph = helper.make_graph([helper.make_node("Identity", ["pixel_values"], ["logits"])], "g", io[:1], io[1:])
    onnx.save(helper.make_model(graph), str(path))
    return str(path)


def test_bench_onnx_files_are_checked_before_any_model_is_exported(pruned_dir, tmp_path, capsys, monkeypatch):
    """Issue 40, item 12: a fixed-batch file was refused only after every model was exported and verified
    (25 s on the tiny model, minutes on DeiT-B)."""
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    import hetprune.measure.export

    def no_export(*args, **kwargs):
        raise AssertionError("a model was exported before the --onnx files were checked")

    monkeypatch.setattr(hetprune.measure.export, "export_onnx", no_export)
    fixed = _onnx_file(tmp_path / "fixed.onnx", [1, 1, 16, 16])
    wide = _onnx_file(tmp_path / "wide.onnx", ["batch", 3, 16, 16])
    (tmp_path / "notes.onnx").write_text("not a model")
    ort = ["bench", str(pruned_dir), "--backend", "onnxruntime", *FAST]
    for files, sizes, message in (
            (fixed, "1,2", f"--onnx {fixed} has a fixed batch of 1: time it at --batch-sizes 1"),
            (wide, "1", f"--onnx {wide} takes input ('?', 3, 16, 16), the models here take (batch, 1, 16, 16)"),
            (str(tmp_path / "notes.onnx"), "1", f"--onnx {tmp_path / 'notes.onnx'} is not a readable ONNX file")):
        assert main([*ort, "--onnx", files, "--batch-sizes", sizes]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {message}"), err
    # measure() from Python: the files are opened before the models are exported too
    with pytest.raises(HetpruneError, match="has a fixed batch of 1"):
        bench.measure({"m": hetprune.load(pruned_dir)}, SHAPE, [2], device="cpu", backend="onnxruntime",
                      onnx_files={"f": fixed})


def test_low_precision_runs_under_autocast_or_in_cast_weights_and_each_row_says_which(tiny_model, monkeypatch):
    """``cast="weights"`` times a bf16 copy of each model on bf16 input (the caller's model stays fp32);
    ``autocast`` the fp32 model under autocast. Rows and the environment line name the precision."""
    seen = []
    real = bench.timing.Runner.__init__

    def watch(self, model, x, device, dtype, fn=None):
        seen.append((None if model is None else next(model.parameters()).dtype, None if x is None else x.dtype,
                     dtype))
        real(self, model, x, device, dtype, fn)

    monkeypatch.setattr(bench.timing.Runner, "__init__", watch)
    for cast, want in (("weights", (torch.bfloat16, torch.bfloat16, "fp32")),
                       ("autocast", (torch.float32, torch.float32, "bf16"))):
        seen.clear()
        result = bench.measure({"m": tiny_model}, SHAPE, [2], device="cpu", dtype="bf16", cast=cast, repeats=1,
                               warmup=0, min_time_s=0)
        assert seen and set(seen) == {want}
        assert result["results"][0]["precision"] == f"bf16 {cast}" == result["environment"]["precision"]
        assert f"bf16 {cast}" in bench.environment_line(result)
        assert tiny_model.cls_token.dtype == torch.float32
    fp32 = bench.measure({"m": tiny_model}, SHAPE, [2], device="cpu", cast="weights", repeats=1, warmup=0,
                         min_time_s=0)
    assert fp32["results"][0]["precision"] == "fp32" and fp32["environment"]["fp32_matmuls"] == "fp32"
    with pytest.raises(HetpruneError, match="cast must be one of autocast, weights"):
        bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", dtype="bf16", cast="half")


def test_tf32_is_set_where_the_gpu_has_it_and_reported(monkeypatch):
    """TF32 for fp32 matmuls on a GPU that has it (on by default, as timm's trainers); a CPU is left alone."""
    from hetprune.core import devices

    before = torch.get_float32_matmul_precision()
    try:
        assert devices.set_tf32(torch.device("cpu"), True) == "fp32"
        assert torch.get_float32_matmul_precision() == before   # untouched on a CPU
        monkeypatch.setattr(devices, "has_tf32", lambda device: True)   # an Ampere-or-later GPU
        assert devices.set_tf32(torch.device("cuda", 0), True) == "tf32"
        assert torch.get_float32_matmul_precision() == "high" and devices.fp32_matmuls(torch.device("cuda")) == "tf32"
        assert devices.set_tf32(torch.device("cuda", 0), False) == "fp32"
        assert torch.get_float32_matmul_precision() == "highest"
        assert devices.fp32_matmuls(torch.device("cuda")) == "fp32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_bench_command_passes_cast_and_tf32(monkeypatch, capsys):
    import hetprune.measure.bench as bench_pkg

    seen = {}

    def fake(models, shape, sizes, **kwargs):
        seen.update(kwargs)
        raise HetpruneError("stop here")

    monkeypatch.setattr(bench_pkg, "measure", fake)
    kwargs = '{"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2}'
    assert main(["bench", "vit_tiny_patch16_224", "--model-kwargs", kwargs, "--device", "cpu", "--dtype", "bf16",
                 "--cast", "weights", "--tf32", "off"]) == 2
    assert seen["cast"] == "weights" and seen["tf32"] is False and seen["dtype"] == "bf16"


def test_measure_puts_the_matmul_precision_back_and_by_default_leaves_the_callers(tiny_model, monkeypatch):
    """``tf32=True/False`` sets fp32 matmuls for the timing and puts them back after (a library call leaves no
    global state behind); None, what a run's latency cost model passes, times under the run's own setting
    (``tf32: false`` must not become TF32 because a cost model timed a model)."""
    from hetprune.core import devices

    monkeypatch.setattr(devices, "has_tf32", lambda device: True)   # as on an Ampere-or-later GPU
    seen = []
    tiny_model.register_forward_pre_hook(lambda m, a: seen.append(torch.get_float32_matmul_precision()))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")   # a run with tf32: false
        result = bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", repeats=1, warmup=0, min_time_s=0)
        assert set(seen) == {"highest"} and result["environment"]["fp32_matmuls"] == "fp32"
        seen.clear()
        result = bench.measure({"m": tiny_model}, SHAPE, [1], device="cpu", repeats=1, warmup=0, min_time_s=0,
                               tf32=True)
        assert "high" in seen and result["environment"]["fp32_matmuls"] == "tf32"
        assert torch.get_float32_matmul_precision() == "highest"   # put back
    finally:
        torch.set_float32_matmul_precision(before)


def test_cast_weights_without_a_half_dtype_is_refused_before_anything_is_timed(tmp_path, capsys):
    """Issue 70, item 8: --cast weights without --dtype bf16|fp16 timed fp32 models as they are and wrote
    "cast": "weights" into --json; refused now, as --plan-probe without --plan is."""
    from hetprune.cli import main

    out = tmp_path / "t.json"
    assert main(["bench", "vit_tiny_patch16_224", "--model-kwargs", '{"img_size": 16, "patch_size": 8, "depth": 1, '
                 '"embed_dim": 16, "num_heads": 2}', "--cast", "weights", "--json", str(out)]) == 2
    assert "--cast weights casts the models' weights to --dtype bf16 or fp16" in capsys.readouterr().err
    assert not out.exists()
