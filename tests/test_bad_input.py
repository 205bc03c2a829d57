"""Bad input across every command: one ``error:`` line, exit 2, no partial output, the input unchanged.

Each case builds what it needs in a fresh folder, runs ``hetprune`` in-process
(``cli.main``), and checks the promise README makes: one line on stderr that
starts with ``error:`` and says what was wrong, exit code 2, no output folder
left behind (or the one that was there untouched), and the input files as they
were.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from hetprune.cli import main
from hetprune.core.io import save_weights
from hetprune.model.spec import ModelSpec, build
from conftest import TINY_KWARGS

TINY = ["--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY_KWARGS)]
FAST = ["--strategy", "act-only", "--scorer", "magnitude", "--set", "finetune.epochs=0"]


class Ctx:
    """A case's folder, with the inputs it made (checked for changes afterwards)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.inputs: list[Path] = []

    def ckpt(self, **kwargs) -> str:
        path = self.root / "tiny.safetensors"
        if not path.exists():
            torch.manual_seed(0)
            save_weights(path, build(ModelSpec("vit_tiny_patch16_224", {**TINY_KWARGS, **kwargs})))
        return self.add(path)

    def file(self, name: str, data: bytes | str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return self.add(path)

    def add(self, path: Path) -> str:
        self.inputs.append(path)
        return str(path)

    def images(self, name: str = "imgs", empty_class: bool = False, corrupt: bool = False,
               val_extra_class: bool = False) -> str:
        from PIL import Image

        root = self.root / name
        for split in ("train", "val"):
            for cls in ("a", "b") + (("c",) if split == "val" and val_extra_class else ()):
                folder = root / split / cls
                folder.mkdir(parents=True, exist_ok=True)
                if empty_class and split == "train" and cls == "b":
                    continue
                for i in range(3):
                    Image.new("RGB", (20, 20), (40 * i, 100, 200)).save(folder / f"{i}.png")
        if corrupt:
            (root / "train" / "a" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
        for p in root.rglob("*.png"):
            self.inputs.append(p)
        return str(root)

    def out(self) -> str:
        return str(self.root / "out")


def saved_model(ctx: Ctx) -> str:
    """A real saved pruned model folder (an input of export/bench/apply cases)."""
    folder = ctx.root / "pruned"
    from hetprune import Recipe, save
    from hetprune.model import surgery
    from hetprune.model.recipe import arch_of

    torch.manual_seed(0)
    spec = ModelSpec("vit_tiny_patch16_224", TINY_KWARGS)
    model = build(spec)
    arch = arch_of(model)
    surgery.remove_activation(model, 0)
    save(folder, model, Recipe(base=spec, arch=arch, act_removed=[0], adapter="timm-vit"))
    for p in folder.iterdir():
        ctx.inputs.append(p)
    return str(folder)


def resnet_ckpt(ctx: Ctx) -> str:
    import timm

    path = ctx.root / "resnet.safetensors"
    save_weights(path, timm.create_model("resnet18", num_classes=10, in_chans=1))
    return ctx.add(path)


class _Exploit:
    """Pickled into a .pth: unpickling it would make the folder ``marker`` (the test sees any new path)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def pickled_ckpt(ctx: Ctx) -> str:
    """A .pth whose state dict is fine but which also holds a pickled object that runs code when unpickled."""
    path = ctx.root / "evil.pth"
    state = build(ModelSpec("vit_tiny_patch16_224", TINY_KWARGS)).state_dict()
    torch.save({"state_dict": state, "extra": _Exploit(str(ctx.root / "code-ran"))}, path)
    return ctx.add(path)


def recipe_file(ctx: Ctx, **changes) -> str:
    d = json.loads((Path(saved_model(ctx)) / "recipe.json").read_text())
    d.update(changes)
    return ctx.file("recipe.json", json.dumps(d))


# (id, argv builder, what the error line must say)
CASES = [
    # names
    ("unknown-strategy", lambda c: ["prune", "--strategy", "nope", "--budget", "2"], "no strategy named 'nope'"),
    ("unknown-scorer", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--scorer", "nope", "--budget", "2",
                                  "--out", c.out()], "no scorer named 'nope'"),
    ("unknown-predictor", lambda c: ["prune", "--predictor", "nope", "--budget", "2", "--out", c.out()],
     "no predictor named 'nope'"),
    ("unknown-compare-strategy", lambda c: ["compare", "--strategies", "hetdpt,nope", "--out", c.out()],
     "no strategy named 'nope'"),
    ("unknown-timm-model", lambda c: ["prune", "--model", "no_such_vit", "--budget", "2", "--out", c.out()],
     "timm has no model named 'no_such_vit'"),
    ("unknown-model-library", lambda c: ["prune", "--model", "nolib:Thing", "--checkpoint", c.ckpt(),
                                         "--budget", "2", "--out", c.out()], "no architecture adapter builds 'nolib'"),
    ("not-a-vit", lambda c: ["prune", "--model", "resnet18", "--model-kwargs", '{"num_classes": 10, "in_chans": 1}',
                             "--checkpoint", resnet_ckpt(c), "--budget", "2", *FAST, "--out", c.out()],
     "no architecture adapter recognises ResNet"),
    # numbers
    ("negative-budget", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "-1", "--out", c.out()],
     "--budget must be a count of sites >= 0"),
    ("budget-too-large", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "99", *FAST,
                                    "--out", c.out()], "more than this model can lose"),
    ("target-macs-nan", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-macs", "nan",
                                   "--out", c.out()], "cannot read MACs 'nan'"),
    ("target-macs-garbage", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-macs", "lots",
                                       "--out", c.out()], "cannot read MACs 'lots'"),
    ("target-speedup-below-one", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "0.5",
                                            "--out", c.out()], "--target-speedup must be >= 1"),
    ("target-speedup-inf", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "inf",
                                      "--out", c.out()], "target-speedup"),
    ("target-latency-without-unit", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-latency", "12",
                                               "--out", c.out()], "write a time with its unit"),
    ("target-latency-counted-in-macs", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-latency",
                                                  "12ms", "--cost-model", "macs", "--out", c.out()],
     "needs a time cost model"),
    ("target-macs-with-latency-model", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-macs", "0.5",
                                                  "--cost-model", "latency", "--out", c.out()],
     "--target-macs counts MACs"),
    ("unknown-cost-model", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "1.5",
                                      "--cost-model", "nope", "--out", c.out()],
     "no cost_model named 'nope' is registered; registered cost_models: latency, macs"),
    ("latency-batch-zero", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "1.5",
                                      "--latency-batch", "0", "--out", c.out()], "--latency-batch must be"),
    ("latency-option-unknown", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "1.5",
                                          "--cost-model", "latency", "--set",
                                          "cost_model_options={latency: {batchsize: 4}}", *FAST, "--out", c.out()],
     "batchsize"),
    ("compare-jobs-with-latency", lambda c: ["compare", *TINY, "--checkpoint", c.ckpt(), "--target-speedup", "1.2",
                                             "--cost-model", "latency", "--jobs", "2", "--out", c.out()],
     "use --jobs 1"),
    ("ablate-without-budget", lambda c: ["ablate", *TINY, "--checkpoint", c.ckpt(), "--out", c.out()],
     "give a budget"),
    ("ablate-budget-too-large", lambda c: ["ablate", *TINY, "--checkpoint", c.ckpt(), "--budget", "99",
                                           "--scorer", "magnitude", "--set", "finetune.epochs=0", "--out", c.out()],
     "more than this model can lose"),
    ("compare-budget-too-large", lambda c: ["compare", *TINY, "--checkpoint", c.ckpt(), "--budgets", "99",
                                            "--strategies", "act-only", "--scorer", "magnitude", "--set",
                                            "finetune.epochs=0", "--out", c.out()], "more than this model can lose"),
    ("subset-frac-out-of-range", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "1",
                                            "--subset-frac", "1.5", *FAST, "--out", c.out()],
     "--subset-frac must be within"),
    ("bench-bad-batch-sizes", lambda c: ["bench", saved_model(c), "--batch-sizes", "1,zero", "--device", "cpu"],
     "batch"),
    ("bench-per-block-onnxruntime", lambda c: ["bench", saved_model(c), "--per-block", "--backend", "onnxruntime",
                                               "--device", "cpu"], "--per-block times PyTorch modules"),
    ("compare-bad-seeds", lambda c: ["compare", "--seeds", "0,x", "--out", c.out()], "seed"),
    # model arguments and weights
    ("model-kwargs-not-json", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs", "{oops",
                                         "--budget", "1", "--out", c.out()], "--model-kwargs is not valid JSON"),
    ("model-kwargs-not-object", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs", "[1]",
                                           "--budget", "1", "--out", c.out()], "--model-kwargs must be a JSON object"),
    ("checkpoint-missing", lambda c: ["prune", *TINY, "--checkpoint", str(c.root / "none.safetensors"),
                                      "--budget", "1", "--out", c.out()], "does not exist"),
    ("checkpoint-truncated", lambda c: ["prune", *TINY, "--checkpoint",
                                        c.file("cut.safetensors", Path(c.ckpt()).read_bytes()[:100]),
                                        "--budget", "1", "--out", c.out()], "safetensors"),
    ("checkpoint-pickled", lambda c: ["prune", *TINY, "--checkpoint", pickled_ckpt(c), "--budget", "1",
                                      "--out", c.out()], r"cannot be read safely .*pickled object \(unsupported GLOBAL"),
    ("checkpoint-of-another-model", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs",
                                               json.dumps({**TINY_KWARGS, "embed_dim": 48}), "--checkpoint",
                                               c.ckpt(), "--budget", "1", "--out", c.out()],
     "does not fit this model"),
    ("selection-split-negative", lambda c: ["prune", "--set", "selection=-1", "--budget", "1", "--out", c.out()],
     r"selection must be a whole number of items >= 0 \(0: none\) or null"),
    # data trees
    ("data-unknown-name", lambda c: ["prune", "--data", "digit-triples", "--budget", "1", "--out", c.out()],
     r"'digit-triples' is neither an embedded data set \(digits, digit-pairs, digit-grid\)"),
    ("data-without-train-folder", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--data",
                                             str(c.root), "--budget", "1", "--out", c.out()], "no train/ folder"),
    ("data-empty-class-folder", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs",
                                           json.dumps({**TINY_KWARGS, "in_chans": 3, "num_classes": 2}),
                                           "--data", c.images(empty_class=True), "--budget", "1", *FAST,
                                           "--out", c.out()], "no valid file for the class"),
    ("data-unreadable-image", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs",
                                         json.dumps({**TINY_KWARGS, "in_chans": 3, "num_classes": 2}),
                                         "--data", c.images(corrupt=True), "--budget", "1", *FAST,
                                         "--set", "finetune.epochs=1", "--out", c.out()],
     "cannot read image .*train/a/0.png"),
    ("data-val-class-missing-in-train", lambda c: ["prune", "--model", "vit_tiny_patch16_224", "--model-kwargs",
                                                   json.dumps({**TINY_KWARGS, "in_chans": 3, "num_classes": 2}),
                                                   "--data", c.images(val_extra_class=True), "--budget", "1",
                                                   *FAST, "--out", c.out()], "different class folders"),
    # settings
    ("config-missing", lambda c: ["prune", "--config", str(c.root / "none.yaml"), "--budget", "1",
                                  "--out", c.out()], "config file .* does not exist"),
    ("config-not-yaml", lambda c: ["prune", "--config", c.file("bad.yaml", "a: [1, 2"), "--budget", "1",
                                   "--out", c.out()], "is not valid YAML"),
    ("config-not-utf8", lambda c: ["prune", "--config", c.file("b.yaml", b"\xff\xfe\x00a: 1"), "--budget", "1",
                                   "--out", c.out()], "is not UTF-8 text"),
    ("config-unknown-key", lambda c: ["prune", "--config", c.file("u.yaml", "finetune:\n  epochz: 3\n"),
                                      "--budget", "1", "--out", c.out()], "unknown key 'finetune.epochz'"),
    ("config-not-a-mapping", lambda c: ["prune", "--config", c.file("l.yaml", "- 1\n- 2\n"), "--budget", "1",
                                        "--out", c.out()], "must hold a mapping"),
    ("set-without-equals", lambda c: ["prune", "--set", "finetune.epochs", "--budget", "1", "--out", c.out()],
     "write KEY=VALUE"),
    ("set-unknown-key", lambda c: ["prune", "--set", "nope=1", "--budget", "1", "--out", c.out()],
     "unknown key 'nope'"),
    ("set-wrong-type", lambda c: ["prune", "--set", "scoring.batches=two", "--budget", "1", "--out", c.out()],
     "scoring.batches"),
    ("set-bad-kd-mode", lambda c: ["prune", "--set", "finetune.kd=sometimes", "--budget", "1", "--out", c.out()],
     "kd must be one of"),
    # recipes
    ("recipe-missing", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe", "no_such_recipe",
                                  "--out", c.out()], "neither a file nor a shipped recipe"),
    ("recipe-not-json", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe", c.file("r.json", "{"),
                                   "--out", c.out()], "r.json"),
    ("recipe-for-another-model", lambda c: ["apply", "--model", "vit_tiny_patch16_224", "--model-kwargs",
                                            json.dumps({**TINY_KWARGS, "depth": 2}), "--recipe",
                                            recipe_file(c), "--out", c.out()], "recipe was made for a model with"),
    ("recipe-bad-index", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe",
                                    recipe_file(c, act_removed=[9]), "--out", c.out()], "out of range"),
    ("recipe-unknown-key", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe",
                                      recipe_file(c, color="red"), "--out", c.out()], "unknown key"),
    ("recipe-width-on-swin", lambda c: ["apply", "--model", "swin_tiny_patch4_window7_224", "--model-kwargs",
                                        json.dumps(dict(img_size=16, in_chans=1, num_classes=10, patch_size=2,
                                                        window_size=4, embed_dim=16, depths=(2, 2),
                                                        num_heads=(1, 2))),
                                        "--recipe", recipe_file(c, arch={}, adapter=None, act_removed=[],
                                                                widths={"embed_dim": 8, "blocks": []}),
                                        "--out", c.out()], "width pruning is not supported for the timm-swin"),
    # folders
    ("output-holds-another-result", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe",
                                               recipe_file(c, act_removed=[1]), "--out", saved_model(c)],
     "already holds a different result"),
    ("prune-output-is-a-file", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "1",
                                          "--out", c.file("taken", "x")], "exists and is not a folder"),
    ("output-not-writable", lambda c: ["apply", *TINY, "--checkpoint", c.ckpt(), "--recipe", recipe_file(c),
                                       "--out", c.file("plain-file", "x") + "/out"],
     "cannot write output folder .* is a file"),
    ("export-unknown-format", lambda c: ["export", saved_model(c), "--format", "tflite", "--out", c.out()],
     "allowed: onnx, pt2, hub"),
    ("export-model-kwargs-for-a-folder", lambda c: ["export", saved_model(c), "--model-kwargs", "{}",
                                                    "--format", "hub", "--out", c.out()],
     "--model-kwargs and --checkpoint are for a model name"),
    ("bench-not-a-model", lambda c: ["bench", str(c.root / "nothing-here"), "--device", "cpu"], "nothing-here"),
    # plugins and devices
    ("plugin-not-importable", lambda c: ["plugins", "--plugin", "no_such_module_xyz"],
     "--plugin 'no_such_module_xyz' cannot be imported"),
    ("device-cuda-without-gpu", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "1",
                                           "--device", "cuda", "--out", c.out()], "cuda"),
    ("device-unknown", lambda c: ["prune", *TINY, "--checkpoint", c.ckpt(), "--budget", "1", "--device", "tpu",
                                  "--out", c.out()], "device"),
]


def digest(paths: list[Path]) -> dict:
    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths if Path(p).is_file()}


def check_one_error(rc, err: str, expected: str) -> None:
    """README's promise: exit 2 and stderr is one line, ``error: ...`` saying what was wrong (no traceback,
    no library text quoted over several lines)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, f"exit {rc}; stderr: {err[-2000:]}"
    assert len(lines) == 1 and (lines[0].startswith("error:") or ": error:" in lines[0]), err[-2000:]
    assert re.search(expected, lines[0]), lines[0]


def new_paths(root: Path, existing: set[Path]) -> list[Path]:
    """Files and folders that appeared under ``root`` (a default ``runs/`` folder and caches aside)."""
    new = {p for p in root.rglob("*")} - existing
    return sorted(p for p in new if p.name != "runs" and not str(p).startswith(str(root / "runs"))
                  and "cache" not in str(p))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_bad_input_is_one_error_line_exit_2_nothing_partial_input_unchanged(case, tmp_path, capsys, monkeypatch):
    _, argv_of, expected = next(c for c in CASES if c[0] == case)
    monkeypatch.chdir(tmp_path)
    ctx = Ctx(tmp_path)
    argv = argv_of(ctx)
    before = digest(ctx.inputs)
    existing = {p for p in tmp_path.rglob("*")}
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    check_one_error(rc, capsys.readouterr().err, expected)
    assert digest(ctx.inputs) == before, "an input file changed"
    left = new_paths(tmp_path, existing)
    assert not left, f"left behind: {left[:5]}"


def test_every_command_has_bad_input_cases(tmp_path):
    """A command added to the CLI without a case here fails this test."""
    from hetprune.cli import COMMANDS

    covered = {argv_of(Ctx(tmp_path / name))[0] for name, argv_of, _ in CASES}
    assert set(COMMANDS) <= covered, f"no bad-input case for: {sorted(set(COMMANDS) - covered)}"
    assert len({c[0] for c in CASES}) == len(CASES), "two cases share an id"


def test_the_check_refuses_what_the_promise_rules_out():
    """The check itself can fail: several lines, a traceback, another exit code or the wrong message."""
    check_one_error(2, "error: config file x.yaml is not valid YAML: bad at line 1, column 2\n", "not valid YAML")
    for rc, err in [(2, "error: not valid YAML: while parsing\n  in line 1\n"),
                    (2, "Traceback (most recent call last):\nerror: not valid YAML\n"),
                    (1, "error: not valid YAML\n"), (2, "error: something else\n"), (2, "")]:
        with pytest.raises(AssertionError):
            check_one_error(rc, err, "not valid YAML")
