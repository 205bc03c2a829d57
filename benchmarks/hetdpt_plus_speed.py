"""HetDPT+ speed on DeiT-B geometry: width only vs depth + width at the same MACs.

Three (four) models with random weights, timed against each other in one run
(interleaved, :func:`hetprune.measure.bench.measure`):

* ``dense``            — ``deit_base_patch16_224``;
* ``isomorphic``       — dense, width-pruned by the ``isomorphic`` width pruner to the target (2.6 GMACs);
* ``hetdpt-plus``      — the shipped recipe ``deit_base_hetdpt_paper`` (attention gone in 5 blocks, GELU gone
                         and MLPs merged in 5) applied to dense, then width-pruned to the same target;
* ``hetdpt`` (``--with-depth-only``) — the recipe alone (depth only, about 10.9 GMACs);
* ``hetdpt-plus, width first`` (``--with-width-first``) — hetdpt-plus's default order: dense width-pruned
  to the target divided by the recipe's MAC fraction, the recipe's sites removed (MLPs merged where it
  pays), then a width trim to the target.

Weights are random: the shapes (what speed depends on) come from magnitude
importance on random weights, not from Taylor importance on ImageNet as in
the papers, so the per-layer widths differ from theirs; the MAC budget is
the same. MACs follow hetprune's convention (:data:`hetprune.model.macs.CONVENTION`).

    python benchmarks/hetdpt_plus_speed.py --batch 1 32 --threads 2 \\
        --out benchmarks/results/hetdpt-plus-speed-cpu-b1-b32.md
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path

import torch
from studylib.files import write
from studylib.tables import table

PAPER = {"isomorphic_2.6G_speedup": 4.24, "hetdpt_plus_speedup": 5.19}


def widths_summary(widths: dict) -> str:
    heads, dims, hidden = [], [], []
    for b in widths["blocks"]:
        if b == "dropped":
            heads.append("-"); hidden.append("-")
            continue
        a, m = b["attn"], b["mlp"]
        heads.append("x" if a == "removed" else f"{a['heads']}")
        if a != "removed":
            dims.append(a["head_dim"])
        hidden.append("M" if m == "merged" else str(m["hidden"]))
    return (f"embed {widths['embed_dim']}; heads per block [{' '.join(heads)}] (x = attention removed); "
            f"head dims {sorted(set(dims))}; MLP hidden [{' '.join(hidden)}] (M = merged {widths['embed_dim']}x"
            f"{widths['embed_dim']} linear)")


def search_text(report: dict) -> str:
    text = f"{len(report['trials'])} trials, {report['seconds']:.0f}s, ratio {report['ratio']:.4f}"
    if report.get("trim_ratio") is not None:
        text += f" then an MLP-only trim at ratio {report['trim_ratio']:.4f}"
    return text


def over_isomorphic(result: dict, batches: list[int]) -> list[str]:
    """The speedup tables of hetdpt-plus (and of its width-first variant, where it was timed) over isomorphic
    per batch, from ``measure``'s result (the results JSON holds it: the page's tables re-render from it)."""
    rows = {(r["model"], r["batch_size"]): r for r in result["results"]}

    def over(model: str) -> list[list]:
        pairs = [(b, rows.get(("isomorphic", b)), rows.get((model, b))) for b in batches]
        return [[b, f"{i['speedup']:.2f}x", f"{h['speedup']:.2f}x", f"{h['speedup'] / i['speedup']:.2f}x"]
                for b, i, h in pairs if i and h]

    lines = table(["batch", "isomorphic speedup", "hetdpt-plus speedup", "hetdpt-plus / isomorphic"],
                  over("hetdpt-plus"))
    if any(m == "hetdpt-plus, width first" for m, _ in rows):
        lines += ["", *table(["batch", "isomorphic speedup", "hetdpt-plus, width first, speedup",
                              "width first / isomorphic"], over("hetdpt-plus, width first"))]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deit_base_patch16_224")
    p.add_argument("--recipe", default="deit_base_hetdpt_paper", help="depth recipe (file or shipped name)")
    p.add_argument("--target", default="2.6G", help="MAC target of both pruned models (absolute or fraction)")
    p.add_argument("--batch", type=int, nargs="+", default=[8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--importance", default="magnitude")
    p.add_argument("--with-depth-only", action="store_true", help="also time the depth-only recipe model")
    p.add_argument("--with-width-first", action="store_true",
                   help="also time hetdpt-plus in its default order: width pruning first, then the recipe's sites")
    p.add_argument("--out", help="Markdown report to write (a .json with the raw result is written beside it)")
    args = p.parse_args(argv)

    import hetprune
    from hetprune.measure.bench import format_table, load_average, measure
    from hetprune.pruning.budget import parse_macs
    from hetprune.model.macs import CONVENTION, count_macs, human
    from hetprune.model.spec import ModelSpec, build
    from hetprune.model.recipe import apply_recipe, resolve_recipe
    from hetprune.model.widths import read_widths

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = load_average()
    started = time.time()
    log = print
    x = torch.randn(1, 3, 224, 224)
    dense = build(ModelSpec(args.model)).eval()
    dense_macs = count_macs(dense, x)
    t = parse_macs(args.target)
    target = t * dense_macs if t <= 1 else t
    log(f"dense {args.model}: {human(dense_macs)} MACs; target {human(target)}")
    registry = hetprune.get_registry()

    class Ctx:
        log = staticmethod(print)

    def width_prune(model, name, to=None):
        pruner = registry.build("width_pruner", "isomorphic", importance=args.importance)
        t0 = time.time()
        report = pruner.prune(model, target if to is None else to, x, Ctx())
        report["seconds"] = round(time.time() - t0, 1)
        log(f"{name}: {human(report['macs'])} MACs after {report['seconds']:.0f}s, {len(report['trials'])} trials")
        return report

    iso = copy.deepcopy(dense)
    iso_report = width_prune(iso, "isomorphic")

    recipe = resolve_recipe(args.recipe)
    depth = apply_recipe(copy.deepcopy(dense), recipe, compute_merge=True).eval()
    depth_macs = count_macs(depth, x)
    plus = copy.deepcopy(depth)
    plus_report = width_prune(plus, "hetdpt-plus")
    first = None
    if args.with_width_first:   # as hetdpt-plus's width-depth order: width, then the sites, then a trim
        from hetprune.model import surgery

        first = copy.deepcopy(dense)
        width_prune(first, "width first", to=min(0.999 * dense_macs, target * dense_macs / depth_macs))
        for b in recipe.attn_removed:
            surgery.remove_attention(first, b, recipe.attn_mode)
        for b in recipe.act_removed:
            surgery.remove_activation(first, b)
        surgery.merge_all(first, blocks=recipe.merged)   # only where merging still pays at these widths
        if count_macs(first, x) > target:
            width_prune(first, "width-first trim")
        first.eval()
    prune_seconds = round(time.time() - started, 1)

    models = {"dense": dense, "isomorphic": iso, "hetdpt-plus": plus}
    if first is not None:
        models["hetdpt-plus, width first"] = first
    if args.with_depth_only:
        models["hetdpt (depth only)"] = depth
    with torch.inference_mode():
        for name, m in models.items():
            y = m(x)
            assert y.shape == (1, 1000) and torch.isfinite(y).all(), name
    result = measure(models, (3, 224, 224), args.batch, device=args.device, dtype=args.dtype,
                     repeats=args.repeats, warmup=args.warmup, min_time_s=args.min_time, reference="dense",
                     threads=args.threads, log=log)
    speeds = format_table(result, markdown=True)
    print(format_table(result))

    env = result["environment"]
    command = "python benchmarks/hetdpt_plus_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"# HetDPT+ speed on DeiT-B geometry ({env['device'].upper()}, {env['dtype']})",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {env['device_name']}, {env['cpu_count']} logical CPUs, {platform.platform()}; torch "
        f"{env['torch']}, timm {env.get('timm')}; {env['threads']} threads, {env['dtype']}. Load average "
        f"{load_before} before pruning, {env.get('load_start')} when timing started, {env.get('load_end')} at the "
        f"end (the cores are shared with other jobs: treat small differences with care).",
        "",
        f"Models (random weights, {args.model}): `isomorphic` = dense width-pruned to {human(target)} MACs by the "
        f"`isomorphic` width pruner ({args.importance} importance); `hetdpt-plus` = shipped recipe "
        f"`{args.recipe}` applied and merged ({human(depth_macs)} MACs), then width-pruned to the same target. "
        f"Pruning both took {prune_seconds:.0f}s. Timing: `hetprune.measure.bench.measure`, interleaved, median of "
        f"{args.repeats} repeats, batch {', '.join(map(str, args.batch))}. MACs: {CONVENTION}.",
        "",
        speeds,
        "",
        "## HetDPT+ over isomorphic at equal MACs",
        "",
        *over_isomorphic(result, args.batch),
        "",
        f"The paper (its own hardware and timing, trained weights) reports {PAPER['hetdpt_plus_speedup']}x for "
        f"HetDPT+ vs "
        f"{PAPER['isomorphic_2.6G_speedup']}x for Isomorphic-2.6G, a ratio of "
        f"{PAPER['hetdpt_plus_speedup'] / PAPER['isomorphic_2.6G_speedup']:.2f}x.",
        "",
        "## Widths",
        "",
        f"* isomorphic: {widths_summary(read_widths(iso))}",
        f"* hetdpt-plus: {widths_summary(read_widths(plus))}",
        *([f"* hetdpt-plus, width first: {widths_summary(read_widths(first))}"] if first is not None else []),
        "",
        f"Width search: isomorphic {search_text(iso_report)}; hetdpt-plus {search_text(plus_report)}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        out = Path(args.out)
        raw = {**result, "command": command, "target_macs": target, "depth_macs": depth_macs,
               "widths": {"isomorphic": read_widths(iso), "hetdpt-plus": read_widths(plus)},
               "width_search": {"isomorphic": iso_report, "hetdpt-plus": plus_report},
               "paper": PAPER, "load_before_pruning": load_before}
        write(out.parent, out.stem, raw, text, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
