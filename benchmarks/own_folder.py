"""The guide "Prune a model on your own folder", run as a user runs it: a folder of grayscale PNGs and a timm
model name, from nothing to a compare table, with hetprune making the dense base (issue 69).

The folder is made here, not taken from an embedded data set: typed digits, 28 x 28 grayscale PNGs in
ImageFolder layout (``DIR/train/<digit>/*.png``, ``DIR/val/<digit>/*.png``), each drawn with Pillow's own font at
a random size, slant, rotation, offset, stroke, contrast, blur and noise, seeded, so anyone makes the same
folder. Then the guide's commands run one after another in a subprocess with an empty cache, exactly as the
guide prints them: ``--plan``, then the compare (which trains the base first). What each printed is the
transcript the guide quotes; the results file has the machine, the load average and the seconds.

    python benchmarks/own_folder.py                          # the folder, the plan, the compare
    python benchmarks/own_folder.py --export digits-folder   # only write the folder (to follow the guide by hand)

Writes benchmarks/results/own-folder.{md,json} and the transcripts benchmarks/results/own-folder-*.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from studylib.files import write
from studylib.machine import load, machine
from studylib.tables import table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZE = 28
TRAIN_PER_CLASS, VAL_PER_CLASS = 400, 100   # 5,000 images in all, as the folder of the user
SEED = 69
# the model of the guide: timm's ViT-Tiny layout at 28 x 28 with 4-pixel patches (49 tokens and the class token),
# one input channel, LayerScale (without it this recipe trains poorly from scratch: DESIGN.md)
MODEL_KWARGS = {"img_size": SIZE, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 64, "depth": 6,
                "num_heads": 2, "init_values": 0.1}
MODEL = ["--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(MODEL_KWARGS)]
LOADED = 1.5   # a run started above this load on 2 cores is marked: rerun it before quoting its seconds


def draw_digit(digit: int, rng):
    """One typed digit, 28 x 28 grayscale: Pillow's font at a random size, offset, slant and rotation, a random
    stroke, contrast, blur and noise."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    canvas = 56
    font = ImageFont.load_default(size=int(rng.integers(26, 40)))
    img = Image.new("L", (canvas, canvas), 0)
    draw = ImageDraw.Draw(img)
    left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=font)
    x = (canvas - (right - left)) / 2 - left + rng.uniform(-4, 4)
    y = (canvas - (bottom - top)) / 2 - top + rng.uniform(-4, 4)
    draw.text((x, y), str(digit), fill=255, font=font, stroke_width=int(rng.integers(0, 3)), stroke_fill=255)
    slant = rng.uniform(-0.3, 0.3)
    img = img.transform(img.size, Image.AFFINE, (1, slant, -slant * canvas / 2, 0, 1, 0), resample=Image.BILINEAR)
    img = img.rotate(rng.uniform(-15, 15), resample=Image.BILINEAR)
    img = img.resize((SIZE, SIZE), Image.LANCZOS).filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.8)))
    pixels = np.asarray(img, dtype=np.float32) / 255
    low, high = rng.uniform(0, 0.25), rng.uniform(0.65, 1.0)
    pixels = low + (high - low) * pixels + rng.normal(0, 0.05, pixels.shape)
    return Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8), "L")


def export(folder: Path, train: int = TRAIN_PER_CLASS, val: int = VAL_PER_CLASS, seed: int = SEED) -> Path:
    """Write the folder: ``train`` and ``val`` images per digit, named by their index, the same for a seed."""
    import numpy as np

    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} is not empty: give a new folder")
    rng = np.random.default_rng(seed)
    for split, per_class in (("train", train), ("val", val)):
        for digit in range(10):
            (folder / split / str(digit)).mkdir(parents=True)
        for i in range(per_class * 10):
            digit = i % 10
            draw_digit(digit, rng).save(folder / split / str(digit) / f"{i:05d}.png")
    return folder


def commands(folder: str) -> list[list[str]]:
    """The guide's commands on ``folder``: the plan, then the compare (which makes the base first), its rows two
    at a time on this 2-core machine (``--jobs 2``: each row a process of its own)."""
    run = ["hetprune", "compare", *MODEL, "--data", folder, "--config", "small-folder", "--base", "scratch",
           "--jobs", "2"]
    return [[*run, "--plan"], run]


def run(command: list[str], cwd: Path, env: dict) -> dict:
    load_start, started = load(), time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{out[-3000:]}")
    return {"command": shlex.join(command), "wall_s": round(wall, 1), "load_start": load_start,
            "load_end": load(), "loaded": load_start[0] > LOADED, "output": out}


def markdown(res: dict) -> str:
    lines = ["# Your own folder, end to end: the guide's commands on a generated folder", "",
             f"Produced by `{res['command']}` (the folder, then each command in a subprocess with an empty cache, "
             "as a user runs them).", "",
             f"Machine: {res['machine']}. Folder: {res['folder']}. A command started above a load average of "
             f"{LOADED} on 2 cores is marked: its seconds are not a headline.", "",
             *table(["command", "wall time", "load at start / end"],
                    [(f"`{s['short']}`", f"{s['wall_s']:.0f} s ({s['wall_s'] / 60:.1f} min)",
                      f"{s['load_start'][0]} / {s['load_end'][0]}" + (" (loaded)" if s["loaded"] else ""))
                     for s in res["steps"]]), ""]
    for step in res["steps"]:
        lines += [f"## `{step['short']}`", "", "```text", step["output"].rstrip(), "```", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", metavar="DIR", help="only write the folder to DIR (a new folder)")
    p.add_argument("--train", type=int, default=TRAIN_PER_CLASS, help="training images per digit")
    p.add_argument("--val", type=int, default=VAL_PER_CLASS, help="validation images per digit")
    p.add_argument("--name", default="own-folder")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args()
    if args.export:
        export(Path(args.export), args.train, args.val)
        print(f"wrote {args.export}: {10 * args.train:,} training and {10 * args.val:,} validation images")
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hetprune-own-folder-") as tmp:
        work = Path(tmp)
        export(work / "digits-folder", args.train, args.val)
        env = dict(os.environ, HETPRUNE_CACHE=str(work / "cache"), HETPRUNE_NO_PROGRESS="1")
        steps = []
        for command in commands("digits-folder"):
            print(f"== {shlex.join(command)}", flush=True)
            step = run(command, work, env)
            step["short"] = shlex.join(command[:2] + ["..."] + command[-5:])
            steps.append(step)
            print(step["output"], flush=True)
    res = {"command": shlex.join(["python", "benchmarks/own_folder.py", *sys.argv[1:]]), "machine": machine(),
           "folder": f"{10 * args.train:,} training and {10 * args.val:,} validation images of typed digits, "
                     f"{SIZE} x {SIZE} grayscale PNGs (seed {SEED})",
           "seconds": round(time.time() - started, 1), "steps": steps}
    write(args.results, args.name, res, markdown(res), echo=False)
    print(f"wrote {Path(args.results) / args.name}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
