"""Train an embedded base model and ship it: write hetprune/weights/<name>.safetensors
and its entry in hetprune/weights/embedded.json (SHA-256, spec, schedule, accuracy,
thread count, versions, machine, this command).

    python scripts/train_embedded.py --data digits
    python scripts/train_embedded.py --data digit-pairs --threads 2
    python scripts/train_embedded.py --data digit-grid --threads 1

It trains from scratch in a fresh cache folder (never reads a cached model), so the
index says exactly how the shipped file was made. Training is deterministic for a
given thread count: the same command on the same thread count gives the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, choices=["digits", "digit-pairs", "digit-grid"])
    p.add_argument("--threads", type=int, default=2, help="torch threads for training (default 2)")
    args = p.parse_args()

    import timm
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["HETPRUNE_CACHE"] = cache
        from hetprune.training.embedded import (SHIPPED, SHIPPED_INDEX, benchmark, embedded_model,
                                                embedded_model_folder)
        from hetprune.training.embedded import embedded_model_info, file_sha256

        start = time.time()
        embedded_model(args.data, retrain=True, progress=False)
        meta = embedded_model_info(args.data, retrain=True)
        target = SHIPPED / f"{args.data}.safetensors"
        shutil.copyfile(embedded_model_folder(args.data) / "model.safetensors", target)
    bench = benchmark(args.data)
    index = json.loads(SHIPPED_INDEX.read_text()) if SHIPPED_INDEX.is_file() else {}
    index[args.data] = {
        "file": target.name,
        "sha256": file_sha256(target),
        "spec": bench.spec.to_dict(),
        "training": bench.settings(None),
        "val_top1": round(meta["val_top1"], 4),
        "threads": args.threads,
        "seconds": round(time.time() - start, 1),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "made_by": "python scripts/train_embedded.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }
    SHIPPED_INDEX.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    print(f"wrote {target.relative_to(ROOT)} ({target.stat().st_size / 1e6:.1f} MB, val top-1 "
          f"{meta['val_top1']:.2f}%, {index[args.data]['seconds']:.0f} s) and {SHIPPED_INDEX.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
