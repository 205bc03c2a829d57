"""`hetprune export`: ONNX verified in ONNX Runtime, torch.export programs,
hub folders, and the bad inputs that must fail cleanly with nothing left."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

import hetprune
from hetprune.measure import export
from hetprune.model import surgery
from hetprune.cli import main
from hetprune.core.errors import HetpruneError
from hetprune.model.spec import ModelSpec, build
from hetprune.model.recipe import arch_of, recipe_from_model

from conftest import TINY_KWARGS, TINY_SPEC

onnx = pytest.importorskip("onnx", reason="the export extra is not installed")


# -- the models every exporter is tested on ------------------------------------------
# (name, base spec kwargs, what to do to it). One entry per kind of model a recipe can
# describe; a new architecture family adds its tiny specs here.
def _depth(attn=(), act=(), merge=(), drop=(), mode="identity", fold_norm=False):
    def prune(model):
        for b in drop:
            surgery.drop_block(model, b)
        for b in attn:
            surgery.remove_attention(model, b, mode)
        for b in act:
            surgery.remove_activation(model, b)
        for b in merge:
            surgery.merge_mlp(model, b, fold_norm=fold_norm)
        return {"fold_norm": fold_norm}

    return prune


def _width(model):
    """Depth surgery, then narrower heads, head dims, MLP hidden and embedding (leading channels kept).

    (Torch-Pruning's isomorphic pruner makes such models in `hetdpt-plus`; here the widths are set directly.)
    """
    from hetprune.model.widths import apply_widths, read_widths

    _depth(attn=[2], act=[3], merge=[3])(model)
    widths = read_widths(model)
    widths["embed_dim"] = 24
    widths["blocks"][0] = {"attn": {"heads": 1, "head_dim": 16}, "mlp": {"hidden": 48}}
    widths["blocks"][1] = {"attn": {"heads": 2, "head_dim": 8}, "mlp": {"hidden": 40}}
    widths["blocks"][2]["mlp"] = {"hidden": 56}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "keeps the leading channels": fine for an export test
        apply_widths(model, widths, compute=True)
    return {"widths": widths}


FAMILY = "vit_tiny_patch16_224"
MODELS = [
    ("dense", {}, _depth()),
    ("attn-act-merged", {}, _depth(attn=[1], act=[2, 3], merge=[2])),
    ("ln-residual-fold-norm", {}, _depth(attn=[0, 3], act=[1], merge=[1], mode="ln-residual", fold_norm=True)),
    ("block-dropped", {}, _depth(attn=[2], act=[1], merge=[1], drop=[0])),
    ("width-pruned", {}, _width),
    ("no-layerscale", {"init_values": None}, _depth(attn=[1], act=[0], merge=[0])),
]


def make(kwargs: dict, prune):
    """``(model, recipe)`` for one entry of MODELS (seeded random weights); ``build(recipe.base)`` is its base."""
    spec = ModelSpec(FAMILY, {**TINY_KWARGS, **kwargs})
    torch.manual_seed(0)
    model = build(spec)
    arch = arch_of(model)
    recipe = recipe_from_model(model, spec, arch, **prune(model))
    return model.eval(), recipe


def predicted_ops(recipe) -> dict:
    """What the graph of a timm ViT pruned by ``recipe`` must hold, from the recipe alone."""
    depth = recipe.arch["depth"]
    attn = [b for b in range(depth) if b not in recipe.attn_removed + recipe.dropped]
    mlps = [b for b in range(depth) if b not in recipe.dropped]
    act = [b for b in mlps if b not in recipe.act_removed]
    linears = 1 + 2 * len(attn) + sum(1 if b in recipe.merged else 2 for b in mlps)  # head, qkv+proj, fc1+fc2
    return {"attention": len(attn), "activation": len(act), "matmul": linears + 2 * len(attn)}


@pytest.mark.parametrize("name,kwargs,prune", MODELS, ids=[m[0] for m in MODELS])
def test_onnx_export_matches_runtime_and_has_no_trace_of_removed_sites(name, kwargs, prune, tmp_path):
    model, recipe = make(kwargs, prune)
    out = tmp_path / "m.onnx"
    result = export.export_onnx(model, out, dynamic_batch=True, base=build(recipe.base))
    graph = onnx.load(str(out))
    onnx.checker.check_model(graph, full_check=True)
    assert export.op_census(graph) == predicted_ops(recipe) == result["census"]
    assert not [n.op_type for n in graph.graph.node if n.op_type == "Identity"]  # nothing left from surgery
    assert result["relative_error"] <= 1e-4 and result["verified_batch"] == 3
    # the file runs at any batch and computes what the PyTorch model computes
    session = export.onnx_session(out)
    x = torch.randn(5, 1, 16, 16)
    got = session.run(None, {export.INPUT_NAME: x.numpy()})[0]
    with torch.inference_mode():
        want = model(x)
    assert torch.allclose(torch.from_numpy(got), want, atol=1e-5, rtol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # no temporary file left


@pytest.mark.parametrize("opset", [17, 23])
def test_onnx_opsets_keep_the_census(opset, tmp_path):
    """From opset 23 attention is one fused op; the census still counts one per site present."""
    model, recipe = make({}, _depth(attn=[1], act=[2], merge=[2]))
    result = export.export_onnx(model, tmp_path / "m.onnx", opset=opset, base=build(recipe.base))
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert {i.version for i in graph.opset_import if i.domain in ("", "ai.onnx")} == {opset}
    assert result["census"] == predicted_ops(recipe)


def test_onnx_fp16(tmp_path):
    model, _ = make({}, _depth(attn=[1], act=[2], merge=[2]))
    result = export.export_onnx(model, tmp_path / "m.onnx", dtype="fp16", batch=2)
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert 0 < result["relative_error"] <= export.TOLERANCE["fp16"]


def test_leftover_activation_is_caught_by_the_census(tmp_path, monkeypatch):
    """A removal that still computes its activation leaves a trace: refused, no file."""
    model, recipe = make({}, _depth(act=[2]))
    monkeypatch.setattr(surgery.RemovedActivation, "forward", lambda self, x: torch.nn.functional.gelu(x))
    with pytest.raises(HetpruneError, match="activation: graph 4, expected 3"):
        export.export_onnx(model, tmp_path / "m.onnx", base=build(recipe.base))
    assert list(tmp_path.iterdir()) == []


def test_runtime_mismatch_is_an_error_and_leaves_no_file(tmp_path, monkeypatch):
    model, _ = make({}, _depth(attn=[1]))
    real = export.onnx_session

    class Off:
        """An ONNX Runtime session whose outputs are off by a little more than the tolerance allows."""

        def __init__(self, session):
            self.session = session

        def get_inputs(self):
            return self.session.get_inputs()

        def run(self, names, feed):
            y = self.session.run(names, feed)[0]
            return [y + 2e-4 * abs(y).max()]

    monkeypatch.setattr(export.to_onnx, "onnx_session", lambda *a, **k: Off(real(*a, **k)))
    with pytest.raises(HetpruneError, match="does not match the PyTorch model"):
        export.export_onnx(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,kwargs,prune", [MODELS[1], MODELS[4]], ids=[MODELS[1][0], MODELS[4][0]])
def test_pt2_export_reloads_and_matches(name, kwargs, prune, tmp_path):
    model, _ = make(kwargs, prune)
    result = export.export_pt2(model, tmp_path / "m.pt2", dynamic_batch=True)
    assert result["relative_error"] <= 1e-4
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = torch.randn(4, 1, 16, 16)
    with torch.inference_mode():
        assert torch.allclose(program(x), model(x), atol=1e-6)


# -- the command ---------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    """A saved pruned tiny model with a pruning report, as `hetprune prune` leaves it."""
    model, recipe = make({}, _depth(attn=[1], act=[2, 3], merge=[2]))
    recipe.provenance.update(strategy="hetdpt", data={"name": "digits", "val": 450},
                             command="hetprune prune --strategy hetdpt --budget 3")
    report = {"strategy": "hetdpt", "budget": {"sites": 3}, "seed": 0, "top1_dense": 97.5,
              "top1_before_finetune": 80.25, "top1": 96.75}
    return hetprune.save(tmp_path / "pruned", model, recipe, extra_files={"report.json": report})


def run_cli(argv, capsys):
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_onnx(saved, tmp_path, capsys):
    out = tmp_path / "pruned.onnx"
    rc, printed, _ = run_cli(["export", str(saved), "--dynamic-batch"], capsys)  # default --out beside the folder
    assert rc == 0 and out.is_file()
    assert "max abs error" in printed and "verified in ONNX Runtime" in printed
    assert "3 attention, 2 activation" in printed


def test_cli_dense_timm_model_by_name(tmp_path, capsys):
    out = tmp_path / "dense.onnx"
    rc, printed, _ = run_cli(["export", FAMILY, "--model-kwargs", json.dumps(TINY_KWARGS), "--out", str(out)], capsys)
    assert rc == 0 and out.is_file() and "4 attention, 4 activation" in printed


def test_cli_hub_folder_loads_back_bit_identically(saved, tmp_path, capsys):
    hub = tmp_path / "hub"
    bench_json = tmp_path / "speed.json"
    bench_json.write_text(json.dumps({
        "environment": {"backend": "onnxruntime"}, "reference": "dense",
        "results": [{"model": "dense", "device": "cpu", "dtype": "fp32", "batch_size": 64, "speedup": 1.0,
                     "mac_ratio": 1.0},
                    {"model": "pruned", "device": "cpu", "dtype": "fp32", "batch_size": 64, "speedup": 1.37,
                     "mac_ratio": 1.42}]}))
    rc, printed, _ = run_cli(["export", str(saved), "--format", "hub", "--out", str(hub),
                              "--bench-json", str(bench_json)], capsys)
    assert rc == 0 and "huggingface-cli upload" in printed
    assert sorted(p.name for p in hub.iterdir()) == ["README.md", "config.json", "model.safetensors", "recipe.json",
                                                     "report.json"]
    assert (hub / "model.safetensors").read_bytes() == (saved / "model.safetensors").read_bytes()
    original, back = hetprune.load(saved), hetprune.load(hub)
    a, b = original.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(3, 1, 16, 16)
    with torch.inference_mode():
        assert torch.equal(original(x), back(x))

    config = json.loads((hub / "config.json").read_text())
    assert config["architecture"] == FAMILY and config["num_classes"] == 10
    assert config["model_args"] == TINY_KWARGS
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [1, 16, 16] and cfg["mean"] == [0.5] and cfg["std"] == [0.5]  # digits, 1 channel
    assert config["hetprune"]["recipe"]["attn_removed"] == [1]

    card = (hub / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: hetprune")
    for text in ("attn1", "act2, act3", "hetdpt", "97.50 %", "96.75 %", "80.25 %", "1.37x", "1.42x",
                 "hetprune prune --strategy hetdpt --budget 3", "--format hub", "huggingface-cli upload"):
        assert text in card, text


def test_hub_folder_of_a_dense_model_by_name_with_a_checkpoint(tmp_path, capsys):
    from hetprune.core.io import save_weights

    torch.manual_seed(3)
    trained = build(TINY_SPEC)
    save_weights(tmp_path / "w.safetensors", trained)
    hub = tmp_path / "hub"
    rc, _, _ = run_cli(["export", FAMILY, "--model-kwargs", json.dumps(TINY_KWARGS), "--format", "hub",
                        "--checkpoint", str(tmp_path / "w.safetensors"), "--out", str(hub)], capsys)
    assert rc == 0
    back, want = hetprune.load(hub).state_dict(), trained.state_dict()
    assert back.keys() == want.keys() and all(torch.equal(back[k], want[k]) for k in want)
    assert "not measured" in (hub / "README.md").read_text()


# -- bad input: one error line, exit 2, nothing partial -------------------------------
def _bad(argv, capsys, folder: Path, match: str):
    before = sorted(p.name for p in folder.iterdir())
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    assert sorted(p.name for p in folder.iterdir()) == before


def test_bad_inputs(saved, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = str(tmp_path / "m.onnx")
    _bad(["export", str(empty), "--out", out], capsys, tmp_path, "not a saved pruned model")
    _bad(["export", str(saved), "--format", "tflite", "--out", out], capsys, tmp_path, "allowed: onnx, pt2, hub")
    _bad(["export", str(saved), "--opset", "99", "--out", out], capsys, tmp_path, "--opset 99 does not exist")
    _bad(["export", str(saved), "--opset", "26", "--out", out], capsys, tmp_path, "is not supported by torch")
    _bad(["export", str(saved), "--dtype", "int8", "--out", out], capsys, tmp_path, "allowed: fp32, fp16")
    (tmp_path / "file").write_text("x")
    _bad(["export", str(saved), "--out", str(tmp_path / "file" / "m.onnx")], capsys, tmp_path,
         "is a file, not a folder")
    _bad(["export", str(saved), "--format", "hub", "--out", str(tmp_path / "file" / "hub")], capsys, tmp_path,
         "is a file, not a folder")
    _bad(["export", str(saved), "--out", str(tmp_path / "file")], capsys, tmp_path, "already exists; pass --overwrite")
    _bad(["export", str(saved), "--format", "hub", "--out", str(saved)], capsys, tmp_path, "already exists")
    _bad(["export", str(tmp_path / "file"), "--out", out], capsys, tmp_path, "is a file")
    assert sorted(p.name for p in saved.iterdir()) == ["model.safetensors", "recipe.json", "report.json"]


def test_missing_extra_names_it(saved, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    _bad(["export", str(saved), "--out", str(tmp_path / "m.onnx")], capsys, tmp_path, "pip install 'hetprune[export]'")


# -- hetprune bench --backend onnxruntime ------------------------------------------------
FAST = ["--device", "cpu", "--repeats", "2", "--warmup", "1", "--min-time", "0", "--threads", "1"]


def test_bench_onnxruntime_backend_interleaved(saved, tmp_path, capsys, monkeypatch):
    from hetprune import bench

    order = []
    timed = bench.OrtRunner.time
    monkeypatch.setattr(bench.OrtRunner, "time", lambda self, n: order.append(self.session) or timed(self, n))
    out = tmp_path / "speed.json"
    rc, printed, _ = run_cli(["bench", str(saved), "--backend", "onnxruntime", "--batch-sizes", "1,3",
                              "--json", str(out), *FAST], capsys)
    assert rc == 0 and "onnxruntime" in printed and "CPUExecutionProvider" in printed and "MAC ratio" in printed
    result = json.loads(out.read_text())
    env = result["environment"]
    assert env["backend"] == "onnxruntime" and env["providers"] == ["CPUExecutionProvider"] and env["threads"] == 1
    assert env["onnxruntime"] == pytest.importorskip("onnxruntime").__version__
    assert [(r["model"], r["batch_size"], r["backend"]) for r in result["results"]] == [
        ("vit_tiny_patch16_224 (dense)", 1, "onnxruntime"), ("pruned", 1, "onnxruntime"),
        ("vit_tiny_patch16_224 (dense)", 3, "onnxruntime"), ("pruned", 3, "onnxruntime")]
    pruned = [r for r in result["results"] if r["model"] == "pruned"]
    assert all(r["speedup"] > 0 and r["mac_ratio"] > 1 and r["paired_speedup"]["median"] > 0 for r in pruned)
    # the two sessions are timed strictly in turn: warm-up, calibration and every repeat, at both batch sizes
    dense, pruned = dict.fromkeys(order)
    assert order == [dense, pruned] * (1 + 1 + 2) * 2


def test_bench_backend_errors(saved, tmp_path, capsys, monkeypatch):
    _bad(["bench", str(saved), "--backend", "tensorrt", *FAST], capsys, tmp_path, "allowed: torch, onnxruntime")
    _bad(["bench", str(saved), "--backend", "onnxruntime", "--dtype", "bf16", *FAST], capsys, tmp_path,
         "for the torch backend")
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        _bad(["bench", str(saved), "--backend", "onnxruntime", *FAST, "--device", "cuda"], capsys, tmp_path,
             "needs ONNX Runtime's CUDA execution provider")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    _bad(["bench", str(saved), "--backend", "onnxruntime", *FAST], capsys, tmp_path, "pip install 'hetprune[export]'")


def test_hub_card_quotes_the_command_that_made_the_model(tmp_path, capsys):
    _, recipe = make({}, _depth(attn=[1], act=[2], merge=[2]))
    recipe.write(tmp_path / "recipe.json")
    made = ["apply", "--model", FAMILY, "--model-kwargs", json.dumps(TINY_KWARGS), "--recipe",
            str(tmp_path / "recipe.json"), "--out", str(tmp_path / "pruned")]
    assert run_cli(made, capsys)[0] == 0
    assert run_cli(["export", str(tmp_path / "pruned"), "--format", "hub"], capsys)[0] == 0
    card = (tmp_path / "pruned-hub" / "README.md").read_text()
    assert export.quote_command(made) in card


# -- issue 40: the Python call -------------------------------------------------------------------
def _no_export(*args, **kwargs):
    raise AssertionError("the model was exported before the call's arguments were checked")


@pytest.mark.parametrize("batch", [0, -2, 1.5, True])
def test_a_batch_that_is_not_a_whole_number_of_images_is_refused_before_any_work(batch, tmp_path, monkeypatch):
    """Item 5: batch=0 wrote a file fixed at batch 0, 'verified' on no image; ONNX Runtime refused every batch."""
    model, _ = make({}, _depth(attn=[1]))
    monkeypatch.setattr(export.to_onnx, "_to_onnx", _no_export)
    monkeypatch.setattr(torch.export, "export", _no_export)
    for call, name in ((export.export_onnx, "m.onnx"), (export.export_pt2, "m.pt2")):
        with pytest.raises(HetpruneError) as exc:
            call(model, tmp_path / name, batch=batch)
        assert str(exc.value) == f"batch={batch!r} is not a batch size; allowed: a whole number >= 1"
    assert list(tmp_path.iterdir()) == []


def test_python_errors_name_the_calls_arguments_not_the_flags(tmp_path, monkeypatch):
    """Item 11 (audit of hetprune/export): a Python caller never typed --opset or --dtype."""
    model, _ = make({}, _depth(attn=[1]))
    monkeypatch.setattr(export.to_onnx, "_to_onnx", _no_export)
    for kwargs, message in (({"opset": 99}, "opset=99 does not exist"),
                            ({"dtype": "int8"}, "dtype='int8' is not supported for export; allowed: fp32, fp16")):
        with pytest.raises(HetpruneError) as exc:
            export.export_onnx(model, tmp_path / "m.onnx", **kwargs)
        assert str(exc.value).startswith(message) and "--" not in str(exc.value), str(exc.value)


def test_an_existing_file_is_never_replaced_without_overwrite(saved, tmp_path, capsys, monkeypatch):
    """S1: from Python export_onnx and export_pt2 silently replaced a file at ``out`` (the CLI refused it)."""
    model, _ = make({}, _depth(attn=[1]))
    with monkeypatch.context() as m:
        m.setattr(export.to_onnx, "_to_onnx", _no_export)
        m.setattr(torch.export, "export", _no_export)
        for call, name in ((export.export_onnx, "m.onnx"), (export.export_pt2, "m.pt2")):
            out = tmp_path / name
            out.write_text("my own file")
            with pytest.raises(HetpruneError) as exc:
                call(model, out)
            assert str(exc.value) == f"output {out} already exists; pass overwrite=True to replace it"
            assert out.read_text() == "my own file"
    assert export.export_onnx(model, tmp_path / "m.onnx", overwrite=True)["relative_error"] <= 1e-4
    assert export.export_pt2(model, tmp_path / "m.pt2", overwrite=True)["relative_error"] <= 1e-4
    # the command line: refused without --overwrite (its own flag named), replaced with it
    out = tmp_path / "cli.onnx"
    out.write_text("my own file")
    _bad(["export", str(saved), "--out", str(out)], capsys, tmp_path, "already exists; pass --overwrite")
    rc, printed, _ = run_cli(["export", str(saved), "--out", str(out), "--overwrite"], capsys)
    assert rc == 0 and "verified in ONNX Runtime" in printed and onnx.load(str(out)).graph.node


# NaFlexViT exports since it is traced at the input shape it was built for (not its default config's 384x384).
# Differential attention takes two softmaxes and four products out per removed site (its two fused attention
# calls), counted from its forward pass; SigLIP's attention-pool query is a product of constants the exporter keeps
# with a free batch, so the base graph is exported with the same batch setting. Every family passes the census.
EXPORTABLE = sorted(__import__("families").FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("key", EXPORTABLE)
def test_every_adapter_family_exports_pruned_and_matches_onnx_runtime(key, tmp_path):
    """Each supported family, with sites removed and MLPs merged: the graph loses exactly those sites'
    ops (checked against the unpruned graph) and ONNX Runtime computes what PyTorch does."""
    from families import make, spec

    from hetprune.model import surgery as surg

    model = make(key)
    surg.remove_attention(model, 0)
    surg.remove_activation(model, 1)
    surg.merge_all(model)
    result = export.export_onnx(model, tmp_path / "m.onnx", dynamic_batch=True, base=build(spec(key)))
    dense = export.op_census(onnx.load(str(tmp_path / "m.onnx")))
    assert result["census"] == dense and result["relative_error"] <= 1e-4


def test_the_cli_default_opset_is_the_exporters():
    from hetprune.cli.commands import export_cmd

    assert export_cmd.DEFAULT_OPSET == export.DEFAULT_OPSET


def test_a_model_torch_cannot_export_is_one_clear_error_and_no_file(tmp_path, monkeypatch):
    model, _ = make({}, _depth(attn=[1]))
    real = model.forward_head

    def untraceable(x, *args, **kwargs):  # what torch.export cannot trace, with or without explicit attention
        if torch.compiler.is_exporting():
            raise RuntimeError("data-dependent control flow")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(model, "forward_head", untraceable)
    with pytest.raises(HetpruneError, match="ONNX exporter failed at opset 18"):
        export.export_onnx(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


# -- a Hugging Face transformers model -------------------------------------------------------
HF_SPEC = ModelSpec("ViTForImageClassification", dict(  # a tiny ViTConfig: built here, nothing downloaded
    image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
    intermediate_size=64, num_labels=10), "hf-vit")


def _hf_pruned():
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    torch.manual_seed(0)
    model = build(HF_SPEC)
    arch = arch_of(model)
    surgery.remove_attention(model, 1)
    surgery.remove_activation(model, 0)
    return model.eval(), recipe_from_model(model, HF_SPEC, arch)


def test_hub_folder_of_a_transformers_model_is_shaped_for_transformers(tmp_path, capsys):
    """Its own config (architectures, model_type) and image processor's mean/std, not timm's."""
    from timm.data import IMAGENET_DEFAULT_MEAN
    from transformers import AutoConfig, AutoImageProcessor, ViTImageProcessor

    model, recipe = _hf_pruned()
    saved = hetprune.save(tmp_path / "hf-pruned", model, recipe)
    hub = tmp_path / "hub"
    rc, _, err = run_cli(["export", str(saved), "--format", "hub", "--out", str(hub)], capsys)
    assert rc == 0, err
    assert "preprocessor_config.json" in {p.name for p in hub.iterdir()}
    config = json.loads((hub / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"] and config["model_type"] == "vit"
    assert "architecture" not in config and "pretrained_cfg" not in config  # timm's keys
    assert config["hetprune"]["recipe"]["attn_removed"] == [1]
    read = AutoConfig.from_pretrained(str(hub))  # a local folder: transformers reads what we wrote
    assert (read.hidden_size, read.num_hidden_layers, read.num_channels, read.image_size) == (32, 3, 1, 16)

    own = ViTImageProcessor()  # transformers' ViT preprocessing, one value per channel of this 1-channel model
    want_mean, want_std = [sum(own.image_mean) / 3], [sum(own.image_std) / 3]
    assert want_mean != [sum(IMAGENET_DEFAULT_MEAN) / 3]  # would be timm's
    processor = AutoImageProcessor.from_pretrained(str(hub))
    assert list(processor.image_mean) == pytest.approx(want_mean) and list(processor.image_std) == pytest.approx(want_std)
    assert (processor.size["height"], processor.size["width"]) == (16, 16)

    card = (hub / "README.md").read_text()
    assert "base_model: timm/" not in card and "ViTForImageClassification" in card
    x = torch.randn(2, 1, 16, 16)
    with torch.inference_mode():
        assert torch.equal(hetprune.load(hub)(x), model(x))


def test_transformers_explicit_attention_runs_without_the_fused_kernel(monkeypatch):
    model, _ = _hf_pruned()
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    adapter = hetprune.model.adapters.adapter_for(model)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        fused = model(x)
        assert len(calls) == 2  # the two attention sites left use the fused kernel
        with adapter.explicit_attention(model):
            explicit = model(x)
            assert len(calls) == 2
        model(x)
    assert len(calls) == 4 and model.model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-6)


def test_transformers_model_onnx_export_falls_back_to_explicit_attention(tmp_path, monkeypatch):
    """An exporter that cannot trace the fused kernel retries with the adapter's explicit attention."""
    model, _ = _hf_pruned()

    real = torch.nn.functional.scaled_dot_product_attention

    def untraceable(*args, **kwargs):  # eager PyTorch (the verification run) still has the kernel
        if torch.compiler.is_exporting():
            raise RuntimeError("this exporter cannot trace scaled_dot_product_attention")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", untraceable)
    result = export.export_onnx(model, tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").is_file() and result["census"]["attention"] == 2


def test_hub_folder_of_a_dense_transformers_model_by_name(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the hf extra is not installed")
    hub = tmp_path / "hub"
    rc, _, err = run_cli(["export", "hf-vit:ViTForImageClassification", "--model-kwargs", json.dumps(HF_SPEC.kwargs),
                          "--format", "hub", "--out", str(hub)], capsys)
    assert rc == 0, err
    config = json.loads((hub / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"] and config["hidden_size"] == 32
    assert hetprune.model.recipe.load_recipe(hub).base == HF_SPEC
