"""Prune a ViT backbone for a dense task with your own metric and training loop.

The task: every pixel of a scikit-learn digit (upscaled to 16x16) is labelled
with its digit (1..10) or background (0). A patch alone rarely tells which
digit it belongs to, so the backbone's attention matters. The model is a timm
ViT backbone inside the example's own module with a per-pixel head; hetprune
finds the backbone itself. The metric is mIoU over the 11 classes, and every
fine-tune hetprune asks for (MAP points, gate training, the final fine-tune)
runs the example's own loop below.

    python examples/segmentation.py                  # about 4 minutes on 2 cores
    python examples/segmentation.py --tiny           # seconds: what the test suite runs
    python examples/segmentation.py --out runs/seg --markdown benchmarks/results/segmentation.md

It prints one table: mIoU, MACs, and speed measured against the dense model
(batch 64, fp32, one thread; models with the same structure are timed once).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hetprune

CLASSES = 11  # background + ten digits
IMG = 16
PATCH = 4


def digit_masks(seed: int = 0, val_size: int = 450):
    """Images (N x 1 x 16 x 16) and per-pixel labels (N x 16 x 16) from scikit-learn's digits."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    images = torch.tensor(raw.images / 16.0, dtype=torch.float32).unsqueeze(1)
    images = F.interpolate(images, size=(IMG, IMG), mode="bilinear", align_corners=False)
    digit = torch.tensor(raw.target, dtype=torch.long)
    labels = torch.where(images[:, 0] > 0.3, digit[:, None, None] + 1, torch.zeros((), dtype=torch.long))
    images = (images - 0.5) / 0.5
    idx = torch.arange(len(digit)).numpy()
    train_idx, val_idx = train_test_split(idx, test_size=val_size, stratify=raw.target, random_state=seed)
    return (TensorDataset(images[train_idx], labels[train_idx]), TensorDataset(images[val_idx], labels[val_idx]))


class Segmenter(nn.Module):
    """A timm ViT backbone (no class token) and a linear head that paints each patch's 4x4 pixels."""

    def __init__(self, depth: int = 8, dim: int = 64, heads: int = 2):
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer

        self.backbone = VisionTransformer(img_size=IMG, patch_size=PATCH, in_chans=1, num_classes=0, embed_dim=dim,
                                          depth=depth, num_heads=heads, class_token=False, global_pool="",
                                          init_values=0.1)
        self.head = nn.Linear(dim, CLASSES * PATCH * PATCH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.backbone.forward_features(x)              # B x (4*4 patches) x dim
        b, g = x.shape[0], IMG // PATCH
        logits = self.head(tokens).view(b, g, g, CLASSES, PATCH, PATCH)
        return logits.permute(0, 3, 1, 4, 2, 5).reshape(b, CLASSES, IMG, IMG)


def pixel_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def miou(model: nn.Module, val) -> float:
    """Mean intersection over union (percent) of the classes present in the labels or the predictions."""
    confusion = torch.zeros(CLASSES, CLASSES, dtype=torch.long)
    for x, y in val:
        pred = model(x).argmax(dim=1)
        confusion += torch.bincount((y * CLASSES + pred).flatten().cpu(), minlength=CLASSES * CLASSES).view(
            CLASSES, CLASSES)
    inter = confusion.diag().double()
    union = confusion.sum(0).double() + confusion.sum(1).double() - inter
    present = union > 0
    return float(100 * (inter[present] / union[present]).mean())


def train_loop(model: nn.Module, data, epochs: int, lr: float, seed: int, teacher: nn.Module | None = None,
               items: int | None = None, batch_size: int = 64) -> list[dict]:
    """The example's own training loop: AdamW, cosine decay, pixel cross-entropy (+ KD from the teacher)."""
    gen = torch.Generator().manual_seed(seed)
    if items is not None and items < len(data):
        data = torch.utils.data.Subset(data, torch.randperm(len(data), generator=gen)[:items].tolist())
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, epochs * len(loader)))
    history = []
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            if teacher is not None:
                with torch.no_grad():
                    target = teacher(x).log_softmax(dim=1)
                loss = 0.5 * loss + 0.5 * F.kl_div(logits.log_softmax(dim=1), target, log_target=True,
                                                   reduction="none").sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(x)
        history.append({"epoch": epoch + 1, "loss": total / len(loader.dataset)})
    model.eval()
    return history


def make_task(train_set, val_set) -> hetprune.Task:
    def finetune(model, teacher, schedule):
        """hetprune calls this for every fine-tune, with the schedule its own trainer would have used."""
        return train_loop(model, train_set, schedule.epochs, schedule.lr, schedule.seed, teacher=teacher,
                          items=schedule.subset)

    return hetprune.Task(
        train=DataLoader(train_set, batch_size=64, shuffle=False),
        val=DataLoader(val_set, batch_size=256),
        loss=pixel_loss, metric=miou, higher_is_better=True, metric_name="mIoU", finetune=finetune,
        name="digit-masks",
    )


def speedups(models: dict[str, nn.Module], batch: int, repeats: int) -> dict[str, float]:
    """Each model's speedup over ``dense``: hetprune's timer (interleaved rounds, median), at one batch size.
    Models with the same structure are timed once and share the figure (identical models must time alike)."""
    shapes = {}
    for name, m in models.items():
        shapes.setdefault(repr(m), name)
    timing = hetprune.measure.bench.measure({n: models[n] for n in shapes.values()}, input_shape=(1, IMG, IMG),
                                    batch_sizes=[batch], device="cpu", reference="dense", repeats=repeats)
    measured = {r["model"]: r.get("speedup", 1.0) for r in timing["results"]}
    return {name: measured[shapes[repr(m)]] for name, m in models.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="a 4-block model and one-epoch schedules (for tests)")
    p.add_argument("--target-macs", type=float, default=0.55, help="MACs of the pruned model, as a share of dense")
    p.add_argument("--strategies", default="hetdpt,act-only,mix50")
    p.add_argument("--out", default="runs/segmentation")
    p.add_argument("--markdown", help="also write the table to this Markdown file")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    started = time.time()
    train_set, val_set = digit_masks()
    if args.tiny:
        train_set = torch.utils.data.Subset(train_set, range(256))
        val_set = torch.utils.data.Subset(val_set, range(128))
    task = make_task(train_set, val_set)
    model = Segmenter(depth=4 if args.tiny else 8, dim=32 if args.tiny else 64)
    base_epochs = 1 if args.tiny else 25
    train_loop(model, train_set, base_epochs, 2e-3, seed=0)
    dense_miou = miou(model.eval(), task.val)
    print(f"dense model: mIoU {dense_miou:.2f}% after {base_epochs} epochs ({time.time() - started:.0f}s)")

    schedule = {"finetune": {"epochs": 1 if args.tiny else 4, "lr": 1e-3},
                "short_finetune": {"epochs": 1, "lr": 1e-3, "subset": 128 if args.tiny else 300},
                "scoring": {"subset": 128 if args.tiny else 300}}
    example = next(iter(task.val))[0][:1]
    rows = [("dense", dense_miou, hetprune.model.macs.count_macs(model, example), "")]
    models = {"dense": model}
    notes = []
    for name in args.strategies.split(","):
        t = time.time()
        result = hetprune.prune(model, task, strategy=name, target_macs=args.target_macs, settings=schedule,
                                out=Path(args.out) / name, overwrite=True, progress=False, log=lambda m: None)
        r = result.report
        sites = f"{r['n_attn']}+{r['n_act']}"
        rows.append((name, r["metric"], r["macs"], sites))
        models[name] = result.model
        alloc = r.get("allocation") or {}
        if "points" in alloc:   # what MAP measured (short fine-tunes) and picked: why hetdpt chose its split
            notes.append(f"{name}: MAP points (attn+act -> mIoU after a short fine-tune): " + ", ".join(
                f"{p['n_attn']}+{p['n_act']} -> {p['metric']:.1f}" for p in alloc["points"])
                + "; predicted over the feasible splits: " + ", ".join(
                f"{d['n_attn']}+{d['n_act']} -> {d['predicted']:.1f}" for d in alloc["surface"])
                + f"; pick {alloc['pick']['n_attn']}+{alloc['pick']['n_act']}.")
        print(f"  {name}: {sites} sites, mIoU {r['metric']:.2f}% ({time.time() - t:.0f}s)")
    speed = speedups(models, batch=64, repeats=3 if args.tiny else 15)

    load = hetprune.measure.bench.load_average()
    lines = ["| model | sites removed (attn+act) | mIoU (%) | MACs per image | measured speedup |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {s or '-'} | {m:.2f} | {hetprune.model.macs.human(c)} | {speed[n]:.2f}x |" for n, m, c, s in rows]
    about = (f"`python examples/segmentation.py{' --tiny' if args.tiny else ''}` on {hetprune.measure.bench.cpu_name()}, "
             f"{torch.get_num_threads()} thread, load average {load[0] if load else 'n/a'}, "
             f"{time.time() - started:.0f}s in all; MAC target {args.target_macs} of dense; torch {torch.__version__}")
    table = "\n".join(lines)
    text = "\n\n".join([table, *notes, about])
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(f"# Segmentation example: a ViT backbone pruned for mIoU\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
