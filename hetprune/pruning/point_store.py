"""Cheap points (a split, its short fine-tune, the task's metric there) stored so a rerun reuses them.

Used by strategies that fit a predictor on points: ``hetdpt``'s MAP points and
``hetdpt-plus``'s share search. Public: a plugin's own point-based strategy can
use it too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..core import distributed as dist
from ..core.errors import HetpruneError
from ..core.io import made_when, note_saved, now
from ..core.keys import Key, fingerprint, matches


def metric_of(point: dict) -> float:
    """A point's value of the task's metric: ``metric``, or ``accuracy`` in points written before the field was
    named for what it holds (it was the metric, whichever it was, an MSE as well)."""
    return float(point["metric"] if "metric" in point else point["accuracy"])


class PointStore:
    """MAP points in JSONL files, each line keyed by the settings that produced it.

    A point is appended (and fsynced) the moment it is measured, with the time;
    lines with another key are kept but never reused, so a changed setting cannot
    pick up stale points. A line that does not parse is reported, never skipped.
    With ``run`` (`hetprune.training.task.reuse_tag`: a task whose code hetprune cannot
    read, without ``--resume``) the store reads only the points this run wrote.

    Under torchrun each rank appends to a file of its own: rank 0 to ``path``
    (``map-points.jsonl``), rank r beside it (``map-points.rank3.jsonl``). One
    writer per file needs no lock (``fcntl.flock`` fails on Lustre mounted
    without flock); `load` merges them, a lower rank's point winning, and a
    single file of an older run reads as rank 0's.
    """

    def __init__(self, path: Path, key: str, run: str | None = None):
        self.path = Path(path)
        self.key = key
        self.run = run

    @staticmethod
    def key_for(job, shaped: dict) -> Key:
        """The key of points a job measures, declared here once for every point store (MAP points, their checks
        and kept path steps, pipeline checks, HetDPT+'s share points): the dense model (``job.base_key``) and the
        task (``job.task.key``) they were measured on, and ``shaped``, what else the scheme says shapes them."""
        return fingerprint({"base": job.base_key, "data": job.task.key, **shaped})

    def at(self, **shaped) -> "PointStore":
        """The same file under a key made from this store's and ``shaped`` (a pipeline check's fraction of its
        schedule: one key per fraction)."""
        return PointStore(self.path, fingerprint({"checks": self.key, **shaped}), self.run)

    def rank_path(self, rank: int) -> Path:
        """The file rank ``rank`` appends to."""
        return self.path if rank == 0 else self.path.with_name(f"{self.path.stem}.rank{rank}{self.path.suffix}")

    def files(self) -> list[Path]:
        """Every existing file of this store, rank 0's last (a later file's point wins)."""
        pattern = re.compile(re.escape(self.path.stem) + r"\.rank(\d+)" + re.escape(self.path.suffix))
        ranks = sorted((int(m.group(1)), f) for f in (self.path.parent.glob(f"{self.path.stem}.rank*{self.path.suffix}")
                                                       if self.path.parent.is_dir() else [])
                       if (m := pattern.fullmatch(f.name)))
        return [f for _, f in reversed(ranks)] + ([self.path] if self.path.is_file() else [])

    def load(self) -> dict[tuple[int, int], dict]:
        found = {}
        for path in self.files():
            found.update(self._read(path))
        return found

    def _read(self, path: Path) -> dict[tuple[int, int], dict]:
        found = {}
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    pair = (int(rec["n_attn"]), int(rec["n_act"]))
                    rec.setdefault("metric", metric_of(rec))   # an old file's ``accuracy`` reads as the metric
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    raise HetpruneError(f"MAP points file {path} line {lineno} is corrupt or truncated ({exc}); "
                                        "delete that line (or the file) to measure the point again") from exc
                if matches(rec.get("key"), self.key) and (self.run is None or rec.get("run") == self.run):
                    found[pair] = rec
        return found

    def say_reused(self, log, prefix: str, reused: list[dict], wanted: int, noun: str = "MAP points") -> None:
        """Say aloud what a run takes from this store instead of measuring it: how many of how many, from which
        file, and when they were measured (nothing when nothing is reused)."""
        if reused:
            log(f"{prefix} reusing {len(reused)} of {wanted} {noun} measured {made_when(reused)}, from {self.path} "
                "(the same base model, task, data and settings)")

    def record(self, job, have: dict, point: dict, event: bool = True) -> dict:
        """Keep one measured point: every rank takes rank 0's record (measured on every rank together, it is
        the same up to reduction order), rank 0 appends it, ``have`` holds it by split, and
        ``on_point_collected`` is announced (``event``). The one recorder of MAP points, HetDPT+'s share points
        and the pipeline checks; returns the record kept."""
        point = dist.broadcast(point)
        if dist.is_main():
            self.append(point)
        have[(point["n_attn"], point["n_act"])] = point
        if event:
            job.event("on_point_collected", point=point)
        return point

    def append(self, record: dict) -> None:
        """Append one point to this rank's file (no lock: no other process writes it)."""
        path = self.rank_path(dist.rank())
        path.parent.mkdir(parents=True, exist_ok=True)
        line = {**record, "key": self.key, "measured_at": now(), **({"run": self.run} if self.run else {})}
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        note_saved(f"a point in {path}")
