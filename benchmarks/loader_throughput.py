"""Images per second per core through hetprune's ImageFolder loader, against timm's own pipeline (issue 57).

    python benchmarks/loader_throughput.py                          # the study (about 7 minutes on 2 cores)
    python benchmarks/loader_throughput.py --pil-simd /tmp/pilsimd  # also in a child process with Pillow-SIMD
    python benchmarks/loader_throughput.py --images /tmp/lt --count 64 --workers 0 --seconds 1 --rounds 1 \\
        --results /tmp/r                                            # a smoke run

Makes (or reuses) an ImageFolder of ImageNet-like JPEGs under ``--images`` (default: a temporary folder):
``--count`` photographic-sized files of ``--size`` pixels (500x375, about 100-130 KB each at quality 90:
smooth colour fields, gradients and grain, so the entropy decoder has a photograph's work), in 4 classes.
Then times, for each ``--augment`` (the paper's DeiT recipe and ``light``) and each ``--workers`` count,
the steady state of one long epoch (the folder repeated; the first batches untimed, so worker start-up is
not counted) through:

* ``timm``: torchvision's ImageFolder with timm's ``create_transform`` for the same recipe and a plain
  DataLoader (timm's own pipeline: the anchor);
* ``hetprune-before``: hetprune's loader (`load_data` + `loader`) as it was before issue 57: timm's
  transform, each item seeded with ``torch.manual_seed``;
* ``hetprune-timm-reader``: today's seeding (the CPU generators only), timm's transform;
* ``hetprune``: today's default: the crop drawn before decoding (JPEG draft when the crop allows), torch's
  uint8 resize, RandAugment's shears and translations by rows, one-step normalisation;
* ``hetprune-uint8``: the same, ending at a uint8 tensor (normalisation and random erasing left to the
  device, timm's prefetcher idea; not wired into training).

Each configuration is timed ``--rounds`` times, interleaved with the others (the median is reported), and
the CPU seconds its worker processes used are read from /proc, so images per CPU-second stays meaningful
on a machine others share. Records the machine, the load average at start and end, and the library
versions. Writes ``benchmarks/results/loader-throughput.md`` and ``.json`` (``--name``, ``--results``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from studylib.files import write
from studylib.machine import load
from studylib.tables import table

from hetprune.core.errors import HetpruneError

HERE = Path(__file__).resolve().parent

PIPELINES = ("timm", "hetprune-before", "hetprune-timm-reader", "hetprune", "hetprune-uint8")
CLASSES = 4
PREFETCH = 4          # batches each worker keeps ready (hetprune's loader's; the anchor gets the same)
GOAL = 2.0            # hetprune over hetprune-before, images per second per core (issue 57) ...
GOAL_AUGMENT = "paper"   # ... with the paper's augmentations, and at or above timm's pipeline
BUSY = 1.5            # a 1-minute load average above this: other work shared the machine
GPU_RATE = 2200       # images/s an H200 trains DeiT-B student + teacher at in bf16 (issue 57's estimate)


# -- the images -------------------------------------------------------------------------------------------

def photo(seed: int, size: tuple[int, int], quality: int) -> bytes:
    """A JPEG with a photograph's structure and file size: a smooth colour field, a gradient, mid-scale blobs
    and fine grain."""
    from PIL import Image

    w, h = size
    rng = np.random.default_rng(seed)
    field = np.asarray(Image.fromarray((rng.random((6, 8, 3)) * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC),
                       np.float32)
    blobs = (rng.normal(0, 40, (max(1, h // 4), max(1, w // 4), 3)) + 128).clip(0, 255).astype(np.uint8)
    blobs = np.asarray(Image.fromarray(blobs).resize((w, h), Image.BILINEAR), np.float32) - 128
    grain = rng.normal(0, 16, (h, w, 1)).astype(np.float32)
    ramp = (np.arange(w, dtype=np.float32) / w * 60 - 30)[None, :, None]
    out = io.BytesIO()
    Image.fromarray((field + blobs + grain + ramp).clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def image_files(root: Path) -> list[Path]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return sorted(p for p in (root / "train").rglob("*") if p.name.lower().endswith(IMG_EXTENSIONS))


def make_folder(root: Path, count: int, size: tuple[int, int], quality: int) -> dict:
    """``root/train/<class>/*.jpg`` (and a small ``val``), made if ``root`` has no ``train/``; a ``train/``
    without images is refused. Returns what the folder holds."""
    if not (root / "train").is_dir():
        for split, n in (("train", count), ("val", CLASSES)):
            for i in range(n):
                folder = root / split / f"class{i % CLASSES}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{i:06d}.jpg").write_bytes(photo(i + (0 if split == "train" else 10 ** 6), size, quality))
    files = image_files(root)
    if not files:
        raise HetpruneError(f"no images to time in {root}/train (expected {root}/train/<class>/*.jpg)")
    from PIL import Image

    with Image.open(files[0]) as first:
        shape = first.size
    return {"folder": str(root), "images": len(files), "size": f"{shape[0]}x{shape[1]}",
            "mean_kb": round(sum(p.stat().st_size for p in files) / len(files) / 1024, 1)}


# -- the pipelines ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def seeding_before():
    """hetprune's per-item seeding before issue 57 (``torch.manual_seed``, which also queues a seed for every
    CUDA device, with a stack trace), for the workers forked inside."""
    from hetprune.training import image_folders, loaders

    kept = image_folders.seed_cpu
    image_folders.seed_cpu = loaders.seed_everything
    try:
        yield
    finally:
        image_folders.seed_cpu = kept


def uint8_ending(dataset) -> None:
    """End hetprune's transform at a uint8 tensor: normalisation and random erasing left to the device."""
    from hetprune.training import images

    transform = dataset.transform
    transform.transforms = [t for t in transform.transforms
                            if type(t).__name__ not in ("NormalizedTensor", "RandomErasing")] + [images.planes]


def repeated(dataset, length: int):
    """``dataset`` repeated to ``length`` items: one long epoch, so no epoch boundary falls in a timing."""
    from torch.utils.data import Subset

    return Subset(dataset, [i % len(dataset) for i in range(length)])


def batches(pipeline: str, augment: str, model, folder: Path, workers: int, batch: int, length: int):
    """An iterator over the batches of one long epoch, and the loader (whose worker processes it holds)."""
    from hetprune.training.data import load_data
    from hetprune.training.loaders import loader

    if pipeline == "timm":   # timm's create_transform for the recipe (what train_transform returns), plainly
        from timm.data import resolve_data_config
        from torch.utils.data import DataLoader
        from torchvision.datasets import ImageFolder

        from hetprune.training.image_folders import train_transform

        dataset = ImageFolder(str(folder / "train"), transform=train_transform(resolve_data_config({}, model=model),
                                                                                augment))
        data_loader = DataLoader(repeated(dataset, length), batch_size=batch, shuffle=True, num_workers=workers,
                                 prefetch_factor=PREFETCH if workers else None)
        return iter(data_loader), data_loader
    reader = "hetprune" if pipeline in ("hetprune", "hetprune-uint8") else "timm"
    data = load_data(str(folder), model, augment=augment, workers=workers, selection=0, reader=reader)
    if pipeline == "hetprune-uint8":
        uint8_ending(data.train.dataset)
    data_loader = loader(repeated(data.train, length), batch, shuffle=True, seed=0, workers=workers)
    return iter(data_loader), data_loader


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of these processes so far (Linux /proc), None where it cannot be read."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None
    return total / tick


def time_one(pipeline: str, augment: str, model, folder: Path, workers: int, batch: int, seconds: float,
             warmup: int) -> dict:
    """One timing: ``warmup`` untimed batches, then batches until ``seconds`` have passed."""
    from hetprune.training.loaders import close_loaders

    length = max(batch * (warmup + 4), int(seconds * 4000 * max(1, workers)))   # never runs out
    scope = seeding_before() if pipeline == "hetprune-before" else contextlib.nullcontext()
    with scope:
        it, data_loader = batches(pipeline, augment, model, folder, workers, batch, length)
        try:
            for _ in range(warmup):
                next(it)
            pids = [w.pid for w in getattr(it, "_workers", [])] or None
            cpu_start = cpu_seconds(pids) if pids else time.process_time()
            start, images = time.perf_counter(), 0
            while True:
                images += len(next(it)[1])
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    break
            cpu_end = cpu_seconds(pids) if pids else time.process_time()
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown:
                shutdown()
            close_loaders()
            del data_loader
    cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    return {"images": images, "seconds": elapsed, "cpu_s": cpu}


def draft_share(augment: str, model, size: tuple[int, int], draws: int = 20000) -> float:
    """The share of this augmentation's crops of a ``size`` image that hetprune's reader decodes reduced (JPEG
    draft mode: the crop at least `images.DRAFT_MARGIN` times the output size at half size)."""
    import random

    from PIL import Image
    from timm.data import resolve_data_config

    from hetprune.training import images
    from hetprune.training.image_folders import train_transform

    crop = train_transform(resolve_data_config({}, model=model), augment).transforms[0]
    blank, state = Image.new("RGB", size), random.getstate()
    random.seed(0)
    try:
        boxes = [crop.get_params(blank, crop.scale, crop.ratio) for _ in range(draws)]
    finally:
        random.setstate(state)
    least = [2 * images.DRAFT_MARGIN * side for side in crop.size]
    return sum(h >= least[0] and w >= least[1] for _, _, h, w in boxes) / draws


def decode_ms(folder: Path, files: int = 48) -> dict:
    """Milliseconds to decode one of the folder's JPEGs in PIL, whole and at 1/2 and 1/4 (draft mode): what
    decoding a crop reduced saves where it applies."""
    from PIL import Image

    paths = image_files(folder)[:files]
    out = {}
    for scale in (1, 2, 4):
        def decode(path):
            with Image.open(path) as img:
                if scale > 1:
                    img.draft(None, (img.size[0] // scale, img.size[1] // scale))
                img.load()

        for path in paths[:4]:
            decode(path)   # warm: the files in the page cache
        start = time.perf_counter()
        for path in paths:
            decode(path)
        out["whole" if scale == 1 else f"1/{scale}"] = round((time.perf_counter() - start) / len(paths) * 1e3, 3)
    return out


# -- the study --------------------------------------------------------------------------------------------

def data_model(name: str):
    """The timm model whose data config the loaders use, built on the meta device (no weights: only its
    config and input size are read)."""
    import timm

    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, num_classes=CLASSES)


def one_round(args, folder: Path, pipelines: list[str]) -> list[list]:
    """Every (pipeline, augment, workers) timed once: ``[pipeline, augment, workers, timing]`` each."""
    torch.set_num_threads(1)   # as in a loader worker: one core per process
    model = data_model(args.model)
    return [[p, a, w, time_one(p, a, model, folder, w, args.batch_size, args.seconds, args.warmup)]
            for a in args.augment for w in args.workers for p in pipelines]


def rows_of(timings: list[list]) -> list[dict]:
    """One row per (pipeline, augment, workers): the median of its rounds' rates, the images and seconds of
    that median round, and images per CPU-second over all its rounds."""
    runs: dict = {}
    for pipeline, augment, workers, timing in timings:
        runs.setdefault((pipeline, augment, workers), []).append(timing)
    rows = []
    for (pipeline, augment, workers), got in runs.items():
        rates = [r["images"] / r["seconds"] for r in got]
        middle = sorted(got, key=lambda r: r["images"] / r["seconds"])[len(got) // 2]
        cpu = [r for r in got if r["cpu_s"]]
        rows.append({"pipeline": pipeline, "augment": augment, "workers": workers, "images": middle["images"],
                     "seconds": round(middle["seconds"], 3), "images_per_s": round(statistics.median(rates), 1),
                     "images_per_s_per_worker": round(statistics.median(rates) / max(1, workers), 1),
                     "rounds": [round(r, 1) for r in rates],
                     "cpu_s": round(middle["cpu_s"], 3) if middle["cpu_s"] else None,
                     "images_per_cpu_s": round(sum(r["images"] for r in cpu) / sum(r["cpu_s"] for r in cpu), 1)
                     if cpu else None})
    return rows


def versions() -> dict:
    import PIL
    import timm
    import torchvision
    from PIL import features

    return {"torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
            "PIL": PIL.__version__, "pillow_simd": ".post" in PIL.__version__,
            "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")), "python": sys.version.split()[0]}


def machine() -> dict:
    from hetprune.measure.bench.environment import cpu_name

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "usable_cores": usable}


def child_round(args, folder: Path, path: str, tag: str) -> tuple[list[list], dict]:
    """One round of timm's and hetprune's pipelines in a child process that imports PIL from ``path``
    (Pillow-SIMD), their pipelines named ``NAME (tag)``."""
    cmd = [sys.executable, __file__, "--child", "--images", str(folder), "--model", args.model,
           "--augment", ",".join(args.augment), "--workers", ",".join(map(str, args.workers)),
           "--seconds", str(args.seconds), "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
           "--pipelines", "timm,hetprune"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise HetpruneError(f"the {tag} run failed: {done.stderr.strip().splitlines()[-1:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return [[f"{p} ({tag})", *rest] for p, *rest in got["timings"]], got["versions"]


def rate(rows: list[dict], pipeline: str, augment: str, workers: int, key: str = "images_per_s_per_worker"):
    return next((r[key] for r in rows if (r["pipeline"], r["augment"], r["workers"]) == (pipeline, augment, workers)),
                None)


def summary(rows: list[dict], augments: list[str], workers: list[int], gpu_rate: float) -> dict:
    """Per augmentation, at the fewest workers timed: hetprune over before and over timm, per worker and per
    CPU-second; the goal; and the cores one GPU needs at ``gpu_rate`` images/s."""
    w = min(workers)
    out = {}
    for augment in augments:
        new, before, anchor = (rate(rows, p, augment, w) for p in ("hetprune", "hetprune-before", "timm"))
        cpu = {p: rate(rows, p, augment, w, "images_per_cpu_s") for p in ("hetprune", "hetprune-before", "timm")}
        ratio = lambda a, b: round(a / b, 2) if a and b else None   # noqa: E731
        per_core = cpu["hetprune"] or new
        out[augment] = {
            "workers": w, "rate": new, "goal_rate": round(GOAL * before, 1) if before else None,
            "over_before": ratio(new, before), "over_timm": ratio(new, anchor),
            "over_before_cpu": ratio(cpu["hetprune"], cpu["hetprune-before"]),
            "over_timm_cpu": ratio(cpu["hetprune"], cpu["timm"]),
            "goal_met": bool(ratio(new, before) and ratio(new, before) >= GOAL and ratio(new, anchor) >= 1.0),
            "cores_per_gpu": math.ceil(gpu_rate / per_core) + 1 if per_core else None,
            "cores_per_gpu_before": (math.ceil(gpu_rate / (cpu["hetprune-before"] or before)) + 1
                                     if (cpu["hetprune-before"] or before) else None)}
    return out


def times(ratio) -> str:
    return f"{ratio}x" if ratio else "-"


def render(res: dict) -> str:
    m, v, f = res["machine"], res["versions"], res["images"]
    lines = [f"# Loader throughput: images per second per core (`{res['name']}`)", "",
             f"Produced by `{res['command']}` (benchmarks/loader_throughput.py). Machine: {m['cpu']}, "
             f"{m['cores']} cores ({m['usable_cores']} usable); load average {res['load_start']} at the start, "
             f"{res['load_end']} at the end (1-minute, after each round: {res['load_after_each_round']})"
             f"{' (others were using the machine: read the rates as provisional)' if res['busy'] else ''}; "
             f"torch {v['torch']}, torchvision {v['torchvision']}, timm {v['timm']}, PIL {v['PIL']} "
             f"({'Pillow-SIMD' if v['pillow_simd'] else 'not Pillow-SIMD'}, "
             f"{'libjpeg-turbo' if v['libjpeg_turbo'] else 'libjpeg'}).", "",
             f"Images: {f['images']} JPEGs of {f['size']} px, {f['mean_kb']} KB on average, {CLASSES} classes; "
             f"model data config of `{res['model']}` (224 px crops); batches of {res['batch_size']}; each row "
             f"the median of {res['rounds']} interleaved timings of {res['seconds']} s after {res['warmup']} "
             "untimed batches. Images/s per worker: the rate over the workers (0 workers: the main process "
             "alone); images per CPU-second: over the CPU time the workers used (read from /proc), which other "
             "processes on the machine do not inflate.", "",
             *table(["pipeline", "augment", "workers", "images", "seconds", "images/s", "images/s per worker",
                     "images per CPU-second", "rounds (images/s)"],
                    [[r["pipeline"], r["augment"], r["workers"], r["images"], r["seconds"], r["images_per_s"],
                      r["images_per_s_per_worker"], r["images_per_cpu_s"] or "-", ", ".join(map(str, r["rounds"]))]
                     for r in res["rows"]])]
    if res["pil_simd_versions"]:
        lines += ["", f"Rows marked (pil-simd): the same pipelines in a child process, each round, with PIL "
                  f"{res['pil_simd_versions']['PIL']} (Pillow-SIMD, built from its source package: "
                  "`CC=\"cc -mavx2\" pip install --target DIR pillow-simd`, then `--pil-simd DIR`)."]
    d = res["decode_ms"]
    lines += ["", f"Decoding one of these JPEGs in PIL takes {d['whole']} ms whole, {d['1/2']} ms at half size and "
              f"{d['1/4']} ms at a quarter (draft mode; the entropy decoding stays). hetprune's reader decodes a "
              f"crop reduced when it stays at least {res['draft_margin']}x the output size: "
              + "; ".join(f"{a}: {share:.1%} of crops of a {f['size']} image"
                          for a, share in res["draft_share"].items())
              + ".", ""]
    for augment, s in res["summary"].items():
        goal = "the goal" if augment == GOAL_AUGMENT else f"the goal set for {GOAL_AUGMENT}"
        verdict = ("hetprune-before or timm was not timed: no verdict" if not (s["over_before"] and s["over_timm"])
                   else f"meets {goal}" if s["goal_met"] else
                   f"misses {goal} ({GOAL:g}x before, at least timm)"
                   + (f" by {(1 - s['over_before'] / GOAL):.0%} ({s['rate']} of the {s['goal_rate']} images/s per "
                      "worker it asks)" if s["over_before"] and s["over_before"] < GOAL else "")
                   + (" and is below timm's pipeline" if s["over_timm"] and s["over_timm"] < 1 else ""))
        lines.append(f"* **{augment}**, {s['workers']} worker(s): hetprune {times(s['over_before'])} "
                     f"hetprune-before and {times(s['over_timm'])} timm in images/s per worker "
                     f"({times(s['over_before_cpu'])} and {times(s['over_timm_cpu'])} per CPU-second): {verdict}. "
                     f"At {res['gpu_rate']:,} images/s (an H200 training DeiT-B student + teacher in bf16, issue "
                     f"57's estimate) one GPU needs {s['cores_per_gpu']} cores (workers + its own process)"
                     + (f", {s['cores_per_gpu_before']} before." if s["cores_per_gpu_before"] else "."))
    return "\n".join(lines) + "\n"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", help="the ImageFolder to time (made there if it has no train/; default: a "
                                     "temporary folder)")
    ap.add_argument("--count", type=int, default=256, help="training images to make")
    ap.add_argument("--size", default="500x375", help="their size, WxH")
    ap.add_argument("--quality", type=int, default=90, help="their JPEG quality")
    ap.add_argument("--model", default="deit_base_patch16_224", help="the timm model whose data config is used")
    ap.add_argument("--augment", default="paper,light", help="augmentations, comma-separated")
    ap.add_argument("--workers", default=None, help="worker counts, comma-separated (default: 1 and "
                                                    "default_workers())")
    ap.add_argument("--pipelines", default=",".join(PIPELINES), help="pipelines, comma-separated")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per configuration and round")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved timings per configuration (the median)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed batches first (default: 2 per worker, at "
                                                             "least 2)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--gpu-rate", type=float, default=GPU_RATE, help="images/s one GPU trains (cores per GPU)")
    ap.add_argument("--pil-simd", metavar="DIR", help="also time timm and hetprune with PIL imported from DIR "
                                                      "(pip install --target DIR pillow-simd)")
    ap.add_argument("--name", default="loader-throughput")
    ap.add_argument("--results", default=str(HERE / "results"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from hetprune.training.loaders import default_workers

    try:
        args.augment = [a for a in args.augment.split(",") if a]
        args.workers = sorted({int(w) for w in args.workers.split(",")} if args.workers else {1, default_workers()})
        args.pipelines = [p for p in args.pipelines.split(",") if p]
        size = tuple(int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise HetpruneError(f"--workers takes whole numbers and --size WxH, got {args.workers!r} and "
                            f"{args.size!r}") from None
    unknown = [p for p in args.pipelines if p not in PIPELINES]
    if unknown or len(size) != 2 or min(args.workers) < 0 or args.seconds <= 0 or args.rounds < 1:
        raise HetpruneError(f"bad options: pipelines {unknown} (known: {', '.join(PIPELINES)}), size {args.size}, "
                            f"workers {args.workers}, seconds {args.seconds}, rounds {args.rounds}")
    args.size = size
    args.warmup = args.warmup if args.warmup is not None else max(2, 2 * max(args.workers))
    return args


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from hetprune.core.config import augmentation

    for a in args.augment:
        augmentation(a)   # one clear error for a name that is not one
    with contextlib.ExitStack() as stack:
        folder = Path(args.images) if args.images else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        made = make_folder(folder, args.count, args.size, args.quality)
        if args.child:
            print(json.dumps({"timings": one_round(args, folder, args.pipelines), "versions": versions()}))
            return 0
        load_start, started = load(), time.time()
        timings, extra_timings, extra_versions, loads = [], [], {}, []
        for _ in range(args.rounds):   # each round times every pipeline once, Pillow-SIMD's child included
            timings += one_round(args, folder, args.pipelines)
            if args.pil_simd:
                got, extra_versions = child_round(args, folder, args.pil_simd, "pil-simd")
                extra_timings += got
            loads.append(load()[0])
        rows = rows_of(timings) + rows_of(extra_timings)
        load_end = load()
        decoding = decode_ms(folder)
    from hetprune.training import images

    model = data_model(args.model)
    res = {"name": args.name, "command": "python benchmarks/loader_throughput.py " + " ".join(
               sys.argv[1:] if argv is None else argv),
           "machine": machine(), "versions": versions(), "pil_simd_versions": extra_versions,
           "load_start": load_start, "load_end": load_end, "load_after_each_round": loads,
           "busy": max(load_start[0], load_end[0], *loads) > BUSY,
           "images": made, "model": args.model, "batch_size": args.batch_size, "seconds": args.seconds,
           "rounds": args.rounds, "warmup": args.warmup, "gpu_rate": args.gpu_rate,
           "minutes": round((time.time() - started) / 60, 1),
           "draft_share": {a: draft_share(a, model, made_size(made)) for a in args.augment},
           "draft_margin": images.DRAFT_MARGIN, "decode_ms": decoding,
           "rows": rows, "summary": summary(rows, args.augment, args.workers, args.gpu_rate)}
    write(args.results, args.name, res, render(res))
    return 0


def made_size(made: dict) -> tuple[int, int]:
    w, h = made["size"].split("x")
    return int(w), int(h)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HetpruneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
