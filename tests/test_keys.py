"""Issue 59, item 1 (in part): `hetprune.core.keys` is the one identity layer. A setting is declared once, in its
field: whether it shapes results (``keyed=False, why=...``) and whether it came after keys were made from its
section (``since=...``). Added in one place, it reaches ``--set`` validation, the settings reference and the
keys of stored results."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from hetprune import HetpruneError
from hetprune.core import config, keys
from hetprune.core import loader
from hetprune.core.config import Section, setting
from hetprune.harness.compare.spec import CompareSpec, row_key
from hetprune.pruning.budget import Budget

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ExtraOptions(Section):
    """A strategy's section, as an outside plugin would declare it."""

    section: ClassVar[str] = "extra_test"
    depth: int = setting(2, "how deep it goes")
    late: int = setting(0, "a setting added after results were stored", since="a test")
    wait_s: float = setting(5.0, "how long it waits for a lock", keyed=False,
                            why="a wait that ends shapes nothing the run makes")

    def __post_init__(self):
        self.need("late", config.whole(self.late, 0), "a whole number >= 0")


class ExtraStrategy:
    name = "extra-test"
    sections = {"extra_test": ExtraOptions}


Section.declared["extra_test"].remove(ExtraOptions)   # declared only while a test here runs (below)


@pytest.fixture(autouse=True)
def declared():
    Section.declared.setdefault("extra_test", []).append(ExtraOptions)
    yield
    Section.declared["extra_test"].remove(ExtraOptions)


def resolved(*sets: str) -> dict:
    return loader.resolve([ExtraStrategy()], sets=list(sets))


def row(settings: dict) -> str:
    spec = CompareSpec(["extra-test"], [Budget(sites=2)], [0], settings)
    return row_key(spec, "extra-test", Budget(sites=2), 0, "base", "data")


def settings_reference():
    spec = importlib.util.spec_from_file_location("settings_reference", ROOT / "docs/hooks/settings_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_setting_added_in_one_place_reaches_set_validation():
    assert resolved()["extra_test"] == {"depth": 2, "wait_s": 5.0}   # the later one is absent at its default
    assert resolved("extra_test.late=3")["extra_test"]["late"] == 3
    with pytest.raises(HetpruneError, match="extra_test.late"):
        resolved("extra_test.late=three")
    with pytest.raises(HetpruneError, match="extra_test.late must be a whole number >= 0"):
        resolved("extra_test.late=-1")
    with pytest.raises(HetpruneError, match="unknown key .extra_test.lat.* allowed here: depth, late, wait_s"):
        resolved("extra_test.lat=1")


def test_a_setting_added_in_one_place_reaches_the_keys():
    before = row(resolved())
    assert row(resolved("extra_test.late=0")) == before, "a later setting at its default moved the stored keys"
    assert row(resolved("extra_test.late=3")) != before, "a later setting that is set leaves the key as it was"
    assert row(resolved("extra_test.depth=3")) != before
    assert row(resolved("extra_test.wait_s=60")) == before, "a setting declared unkeyed moved the key"
    assert config.unkeyed_settings()["extra_test.wait_s"] == "a wait that ends shapes nothing the run makes"


def test_a_setting_added_in_one_place_reaches_the_settings_reference():
    lines = "\n".join(settings_reference().table(ExtraOptions, "extra_test"))
    assert "| `extra_test.depth` | int | `2` | how deep it goes |" in lines
    assert "`extra_test.late` | int | `0` | a setting added after results were stored *Since a test:*" in lines
    assert "*Not in any result's key:* a wait that ends shapes nothing the run makes." in lines


def test_the_core_declares_its_key_rules_in_its_fields():
    assert keys.unkeyed(config.RunSettings) == {"dist_timeout_min": config.unkeyed_settings()["dist_timeout_min"],
                                                "base_scratch": config.BASE_UNKEYED, "base_finetune": config.BASE_UNKEYED}
    assert set(keys.later_defaults(config.RunSettings)) == {"tf32", "augment", "selection", "base_scratch",
                                                            "base_finetune"}
    # an unkeyed section (a base's schedule) is listed field by field, with the section's reason
    assert {f"base_scratch.{name}" for name in ("epochs", "lr", "mixup", "image_passes")} <= set(
        config.unkeyed_settings())
    later = keys.later_defaults(config.TrainConfig)
    assert {"mixup", "batch_per_gpu", "compile"} <= set(later) and "epochs" not in later
    assert not set(later) & set(config.TrainConfig().to_dict())   # left out at their defaults ...
    assert config.TrainConfig(mixup=0.2).to_dict()["mixup"] == 0.2   # ... and present when set


def test_an_unkeyed_setting_must_say_why():
    with pytest.raises(ValueError, match="says why"):
        setting(1, "help", keyed=False)


def test_names_in_keys_come_from_the_keys_table_not_the_import_paths():
    from hetprune import aliases

    assert keys.stable_name("hetprune.training.task") == "hetprune.task"
    assert keys.stable_name("hetprune.training.loaders") == "hetprune.data"   # split out since: its parent's
    assert keys.stable_name("hetprune.core.keys") == "hetprune.cache"   # the module the hash function lived in
    assert set(keys.MOVED.items()) <= set(aliases.ALIASES.items())   # the import paths serve at least those


def test_every_stores_keys_are_where_the_last_release_left_them():
    """The keys of MAP points (every scheme, paths, checks), pipeline checks, share points and truth rows for
    one fixed job (tests/store_keys.py): this release's where key version 2 put them, and each one's ``before``
    what the code made before the key layer, under version 1, so the stores find results stored then."""
    import json

    from store_keys import keys_now

    made = keys_now()
    assert keys.then(made) == json.loads((ROOT / "tests" / "data" / "store-keys.json").read_text())
    assert made == json.loads((ROOT / "tests" / "data" / "store-keys-v2.json").read_text())


def test_a_plugin_that_reads_schedules_as_dicts_still_works_and_is_told_what_to_read():
    """``job.config.finetune`` and ``.scoring`` were dicts before the typed settings: a plugin's dict reads
    work, each with a DeprecationWarning naming the attribute."""
    run = config.RunSettings()
    with pytest.warns(DeprecationWarning, match=r"TrainConfig is a typed settings object now: read \.lr"):
        assert run.finetune["lr"] == run.finetune.lr
    with pytest.warns(DeprecationWarning, match=r"read \.subset"):
        assert run.scoring.get("subset") == run.scoring.subset
    with pytest.warns(DeprecationWarning):
        assert {**run.short_finetune} == run.short_finetune.as_settings()
