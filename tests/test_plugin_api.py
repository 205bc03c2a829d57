"""The public plugin surface (issue 59, item 3): "rank 0 decides a resume, everyone follows", written once
(`hetprune.core.distributed.follow_saved`)."""

from __future__ import annotations

import pytest

from hetprune import HetpruneError
from hetprune.core import distributed as dist


# -- rank 0 decides a resume, everyone follows ---------------------------------------------------------------

def _as_rank(monkeypatch, rank: int, box: dict) -> None:
    """This process plays ``rank`` of two: rank 0's broadcast lands in ``box``, rank 1 reads it from there."""
    monkeypatch.setattr(dist, "active", lambda: True)
    monkeypatch.setattr(dist, "is_main", lambda: rank == 0)

    def on_main(fn):
        if rank == 0:
            box["token"] = fn()
        return box["token"]

    monkeypatch.setattr(dist, "on_main", on_main)
    monkeypatch.setattr(dist, "all_gather", lambda obj: [None, obj] if rank else [obj, None])


def _saved(tmp_path, name: str, step: int):
    file = tmp_path / name
    file.write_text(str(step))
    return file


def _read(file):
    return {"step": int(file.read_text())}


def test_outside_torchrun_the_first_reusable_file_is_the_decision(tmp_path):
    files = [tmp_path / "missing", _saved(tmp_path, "b", 2), _saved(tmp_path, "c", 1)]
    said = []
    found = dist.follow_saved(files, _read, lambda s: s["step"], "resume: test",
                              reuse=lambda file, state: said.append(file.name) or state["step"] < 2)
    assert found == (2, {"step": 1}) and said == ["b", "c"]
    assert dist.follow_saved(files[:1], _read, lambda s: s["step"], "resume: test") is None
    assert dist.follow_saved(files, _read, lambda s: s["step"], "x", distributed=False) == (1, {"step": 2})


def test_every_rank_follows_rank_0s_file_or_every_rank_stops_with_one_error(tmp_path, monkeypatch):
    mine, theirs = tmp_path / "rank0", tmp_path / "rank1"
    mine.mkdir(), theirs.mkdir()
    box: dict = {}
    _as_rank(monkeypatch, 0, box)
    decided = dist.follow_saved([_saved(mine, "ckpt", 3)], _read, lambda s: s["step"], "resume: test")
    assert decided == (0, {"step": 3})

    _as_rank(monkeypatch, 1, box)
    with pytest.raises(HetpruneError, match=r"^resume: test: rank 1 cannot follow rank 0's decision: it finds no "
                                            rf"{theirs / 'ckpt'}, which rank 0 continues from"):
        dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test")
    _saved(theirs, "ckpt", 4)
    with pytest.raises(HetpruneError, match=r"its .*ckpt \(step 4\) is not the one rank 0 continues path p from "
                                            r"\(step 3\)"):
        dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test", continues=" path p",
                          describe=lambda step: f"step {step}")
    _saved(theirs, "ckpt", 3)
    assert dist.follow_saved([theirs / "ckpt"], _read, lambda s: s["step"], "resume: test") == (0, {"step": 3})
    # by_name: rank 0's file itself, whatever this rank's own paths are
    assert dist.follow_saved([tmp_path / "elsewhere"], _read, lambda s: s["step"], "resume: test",
                             by_name=True) == (0, {"step": 3})
