"""Formatting a measurement for people: the tables ``hetprune bench`` prints.
"""

from __future__ import annotations

from ...model.macs import human


def format_per_block(label: str, result: dict) -> str:
    """A table of `per_block`: one row per block, then the totals."""
    lines = [f"{label}: where the time goes at batch {result['batch_size']} on {result['device']} "
             f"(median of {result['repeats']} forward passes, ms)",
             f"  {'block':>5}  {'attention':>9}  {'mlp':>9}  {'other':>9}  {'total':>9}"]
    for r in result["blocks"]:
        lines.append(f"  {r['block']:>5}  {r['attention_ms']:>9.3f}  {r['mlp_ms']:>9.3f}  {r['other_ms']:>9.3f}  "
                     f"{r['total_ms']:>9.3f}")
    sums = {k: sum(r[k] for r in result["blocks"]) for k in ("attention_ms", "mlp_ms", "other_ms", "total_ms")}
    lines.append(f"  {'all':>5}  {sums['attention_ms']:>9.3f}  {sums['mlp_ms']:>9.3f}  {sums['other_ms']:>9.3f}  "
                 f"{sums['total_ms']:>9.3f}")
    lines.append(f"  outside the blocks (embedding, head): {result['outside_blocks_ms']:.3f}; "
                 f"whole model: {result['model_ms']:.3f}")
    return "\n".join(lines)


def _human(n) -> str:
    """A count for the table; ``-`` where it is not known (an ONNX file that does not record its costs)."""
    return human(n) if n is not None else "-"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s * 1e3 >= 10 else f"{s * 1e3:.3g}"


def environment_line(result: dict) -> str:
    env = result["environment"]
    ort = (f", onnxruntime {env['onnxruntime']} ({', '.join(env['providers'])})"
           if env.get("backend") == "onnxruntime" else "")
    return (f"{env['device_name']} ({env['device']}), torch {env['torch']}{ort}, {env['threads']} threads, "
            f"{env.get('precision', env['dtype'])}{', compiled' if env['compile'] else ''}"
            f"{', fp32 matmuls in TF32' if env.get('fp32_matmuls') == 'tf32' else ''}; load average "
            f"{env.get('load_start')} at start, {env.get('load_end')} at end")


def format_table(result: dict, markdown: bool = False) -> str:
    """The result as a terminal table, or as a Markdown table."""
    has_ref = result.get("reference") is not None
    has_mem = any(r.get("peak_memory_bytes") is not None for r in result["results"])
    head = ["model", "batch", "params", "MACs", "latency ms (median)", "IQR ms", "img/s"]
    if has_ref:
        head += ["speedup", "spread", "per-round IQR", "MAC ratio", "speedup / MAC ratio"]
    if has_mem:
        head += ["peak mem"]
    lines = []
    for r in result["results"]:
        lat = r["latency_s"]
        batch = str(r["batch_size"]) + ("*" if r["batch_size"] != r["requested_batch_size"] else "")
        row = [r["model"], batch, _human(r["params"]), _human(r["macs"]), _ms(lat["median"]),
               f"{_ms(lat['q1'])}-{_ms(lat['q3'])}", f"{r['throughput_img_s']:.1f}"]
        if has_ref:
            paired = r.get("paired_speedup")
            spread = r.get("speedup_spread")
            row += [f"{r['speedup']:.2f}x", f"±{spread:.1%}" if spread is not None else "-",
                    f"{paired['q1']:.2f}-{paired['q3']:.2f}x" if paired else "-",
                    f"{r['mac_ratio']:.2f}x" if r.get("mac_ratio") is not None else "-",
                    f"{r['speedup_over_mac_ratio']:.0%}" if r.get("speedup_over_mac_ratio") is not None else "-"]
        if has_mem:
            mem = r.get("peak_memory_bytes")
            row += [human(mem) + "B" if mem is not None else "-"]
        lines.append(row)
    notes = sorted({r["note"] for r in result["results"] if r.get("note")})
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in lines]
    else:
        widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *lines]]
    if markdown:
        out.append("")  # end the table: GFM would read a following plain line as one more row
    out += [f"* {n}" for n in notes]
    if has_ref:
        out.append(f"speedup = median latency of {result['reference']} / the model's, same batch; per-round IQR = "
                   f"quartiles of the ratio within each interleaved round (spread: half their interquartile range, "
                   f"relative to the median; {max(r.get('rounds', 0) for r in result['results'])} rounds at most); "
                   f"MAC ratio from "
                   f"{result['macs_convention']}")
    out.append(environment_line(result))
    return "\n".join(out)
