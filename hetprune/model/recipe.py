"""Recipes: the declarative result of pruning, and pruned models on disk.

A recipe says which sites were removed (and how), which MLPs were merged,
the per-layer widths after width pruning, and where it came from. Applying it
to a fresh base model rebuilds the pruned architecture; a saved pruned model
is a folder with ``recipe.json`` + ``model.safetensors`` and nothing pickled.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from . import surgery
from ..core.keys import qualified_name
from ..core.errors import HetpruneError
from ..core.io import ResultFolder, atomic_folder, load_weights, read_json, save_weights, write_json_atomic
from .spec import ModelSpec, build, check_kwargs, load_state_into
from .adapters import adapter_for, serving
from .sites import Site, depth, sites

SCHEMA_VERSION = 1
RECIPE_FILE = "recipe.json"
WEIGHTS_FILE = "model.safetensors"
REPORT_FILE = "report.json"
# a pruned model's folder, as prune, apply and compare's models/ write it
PRUNED_MODEL = ResultFolder("pruned model", frozenset({RECIPE_FILE, WEIGHTS_FILE, REPORT_FILE}), beside=".work")


def arch_of(model: nn.Module) -> dict:
    """The shape facts a recipe must agree with (depth, embed dim, heads, MLP hidden), from the adapter."""
    return adapter_for(model).arch(model)


@dataclass
class Recipe:
    base: ModelSpec
    arch: dict
    attn_removed: list[int] = field(default_factory=list)
    act_removed: list[int] = field(default_factory=list)
    attn_mode: str = "identity"
    merged: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    fold_norm: bool = False
    widths: dict | None = None
    adapter: str | None = None      # the architecture adapter that made it (None: any that matches)
    provenance: dict = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    # -- construction -------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, where: str = "recipe") -> "Recipe":
        if not isinstance(d, dict):
            raise HetpruneError(f"{where} is not a JSON object")
        if d.get("schema") != SCHEMA_VERSION:
            raise HetpruneError(f"{where} has schema {d.get('schema')!r}; this hetprune reads schema {SCHEMA_VERSION}")
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise HetpruneError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
        for key in ("base", "arch"):
            if key not in d:
                raise HetpruneError(f"{where} is missing {key!r}")
        for key in ("attn_removed", "act_removed", "merged", "dropped"):
            value = d.get(key, [])
            if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                raise HetpruneError(f"{where}: {key!r} must be a list of block indices, got {value!r}")
        if not isinstance(d["arch"], dict):
            raise HetpruneError(f"{where}: 'arch' must be a JSON object like {{\"depth\": 12, ...}}, got {d['arch']!r}")
        if not isinstance(d.get("fold_norm", False), bool):
            raise HetpruneError(f"{where}: 'fold_norm' must be true or false, got {d.get('fold_norm')!r}")
        for key in ("widths", "provenance"):
            if d.get(key) is not None and not isinstance(d[key], dict):
                raise HetpruneError(f"{where}: {key!r} must be a JSON object or null, got {d[key]!r}")
        if d.get("adapter") is not None and not isinstance(d["adapter"], str):
            raise HetpruneError(f"{where}: 'adapter' must be an adapter name or null, got {d['adapter']!r}")
        if d.get("attn_mode", "identity") not in surgery.ATTN_MODES:
            raise HetpruneError(f"{where}: attn_mode must be one of {surgery.ATTN_MODES}, got {d.get('attn_mode')!r}")
        fields_ = dict(d)
        try:
            fields_["base"] = ModelSpec.from_dict(d["base"])
        except HetpruneError as exc:
            raise HetpruneError(f"{where}: 'base': {exc}") from None
        fields_["provenance"] = d.get("provenance") or {}
        return cls(**fields_)

    @classmethod
    def read(cls, path: str | Path) -> "Recipe":
        return cls.from_dict(read_json(path, "recipe file"), where=f"recipe {path}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["base"] = self.base.to_dict()
        return {"schema": d.pop("schema"), **d}

    def write(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    # -- facts ----------------------------------------------------------------
    @property
    def removed_sites(self) -> list[Site]:
        """Every removed site, a dropped block counting as both of its sites."""
        attn = sorted(self.attn_removed + self.dropped)
        act = sorted(self.act_removed + self.dropped)
        return [Site(b, "attn") for b in attn] + [Site(b, "act") for b in act]

    @property
    def n_attn(self) -> int:
        return len(self.attn_removed) + len(self.dropped)

    @property
    def n_act(self) -> int:
        return len(self.act_removed) + len(self.dropped)

    def check_fits(self, model: nn.Module) -> None:
        """Refuse a recipe made for another architecture, or with bad indices."""
        adapter = adapter_for(model)
        if self.adapter is not None and adapter.name != self.adapter:
            raise HetpruneError(f"recipe was made with the {self.adapter} adapter, but this model "
                                f"({type(model).__name__}) is served by {adapter.name}; apply it to the model it was "
                                f"made for (recipe base: {self.base.name})")
        actual = adapter.arch(model)
        for key, want in self.arch.items():
            if want is not None and actual.get(key) is not None and actual[key] != want:
                raise HetpruneError(
                    f"recipe was made for a model with {key}={want}, but this model has {key}={actual[key]} "
                    f"(recipe base: {self.base.name}); apply it to the model it was made for"
                )
        depth = len(adapter.block_slots(model))
        for key in ("attn_removed", "act_removed", "merged", "dropped"):
            values = getattr(self, key)
            bad = [i for i in values if not 0 <= i < depth]
            if bad:
                raise HetpruneError(f"recipe {key} has block indices {bad} out of range: the model has blocks 0..{depth - 1}")
            if len(set(values)) != len(values):
                raise HetpruneError(f"recipe {key} lists a block twice: {values}")
        both = sorted(set(self.dropped) & (set(self.attn_removed) | set(self.act_removed)))
        if both:
            raise HetpruneError(f"recipe drops blocks {both} and also lists their sites as removed")
        not_linear = sorted(set(self.merged) - set(self.act_removed))
        if not_linear:
            raise HetpruneError(f"recipe merges blocks {not_linear} whose activation is not removed")
        if self.n_attn > adapter.max_removals(model)["attn"]:
            raise HetpruneError("recipe removes every attention site of a class-token model: the class token "
                                "would never see the image and the output would be constant")


def recipe_from_model(model: nn.Module, base: ModelSpec, arch: dict, fold_norm: bool = False,
                      widths: dict | None = None, provenance: dict | None = None) -> Recipe:
    """Read a pruned model's structure back into a recipe: what was done, not what was asked.

    ``fold_norm`` is read from the model (whether merged blocks had their norm's
    affine folded); the argument is kept for callers that still pass what they
    configured, and a disagreement is resolved by the model.
    """
    adapter = adapter_for(model)
    n = depth(model)
    dropped = surgery.dropped_blocks(model)
    attn = [i for i in range(n) if i not in dropped and adapter.removed(model, i, "attn")]
    act = [i for i in range(n) if i not in dropped and adapter.removed(model, i, "act")]
    modes = {adapter.attn_mode(model, i) for i in attn}
    if len(modes) > 1:
        raise HetpruneError(f"model mixes attention removal modes {sorted(modes)}; a recipe holds one")
    merged = [i for i in range(n) if adapter.is_merged(model, i)]
    folded = {adapter.norm_folded(model, i) for i in merged}
    if len(folded) > 1:
        raise HetpruneError(f"model folds the norm of some merged blocks and not of others ({merged}); a recipe "
                            "holds one fold_norm: use one merger (linear-merge or ln-fold), not both")
    fold_norm = folded.pop() if folded else False
    return Recipe(base=base, arch=arch, attn_removed=attn, act_removed=act, dropped=dropped,
                  attn_mode=modes.pop() if modes else "identity", merged=merged, fold_norm=fold_norm,
                  widths=widths, adapter=adapter.name, provenance={**default_provenance(), **(provenance or {})})


def default_provenance() -> dict:
    import timm

    import hetprune

    versions = {"hetprune": hetprune.__version__, "torch": torch.__version__, "timm": timm.__version__}
    try:
        import torch_pruning

        versions["torch_pruning"] = torch_pruning.__version__
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    return {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "versions": versions}


def apply_recipe(model: nn.Module, recipe: Recipe, compute_merge: bool = True, allow_kwargs=(),
                 adapter=None) -> nn.Module:
    """Apply ``recipe`` to an unpruned ``model`` in place and return it.

    ``compute_merge=True`` merges with the model's real weights (pruning a
    trained model); ``False`` only shapes the merged layers, for loading
    saved weights afterwards. A recipe whose base kwargs could read files or
    the network is refused (it travels on with the model, and whoever builds
    its base reads them) unless ``allow_kwargs`` names them. ``model`` may be
    one the user built (a recipe made by ``hetprune.prune`` on such a model
    says so); ``adapter`` is the one it was pruned with where no registered
    adapter serves it (``hetprune.model.adapters.generic(...)``).
    """
    check_kwargs(recipe.base, allow_kwargs, "recipe")
    if adapter is not None:
        with serving(adapter):
            return apply_recipe(model, recipe, compute_merge, allow_kwargs)
    if recipe.base.is_user_built and qualified_name(type(model)) != recipe.base.name:
        raise HetpruneError(f"recipe was made for a user-built {recipe.base.name}, but the model given is a "
                            + qualified_name(type(model)))
    recipe.check_fits(model)
    already = [str(s) for s in sites(model, present_only=False) if surgery.site_removed(model, s)]
    if already:
        raise HetpruneError(f"a recipe is applied to an unpruned model, but this one has lost {', '.join(already)} "
                            "already; build a fresh base model")
    for b in recipe.dropped:
        surgery.drop_block(model, b)
    for b in recipe.attn_removed:
        surgery.remove_attention(model, b, recipe.attn_mode)
    for b in recipe.act_removed:
        surgery.remove_activation(model, b)
    if recipe.widths and compute_merge:
        # widths first, then merges: the merged layer is then what width pruning kept, whichever came first
        from .widths import apply_widths

        apply_widths(model, recipe.widths, compute=True, merge_pending=True)
        for b in recipe.merged:
            surgery.merge_mlp(model, b, fold_norm=recipe.fold_norm)
        return model
    for b in recipe.merged:
        if compute_merge:
            surgery.merge_mlp(model, b, fold_norm=recipe.fold_norm)
        else:
            surgery.prepare_merge(model, b, fold_norm=recipe.fold_norm)
    if recipe.widths:
        from .widths import apply_widths

        apply_widths(model, recipe.widths, compute=False)
    return model


def shipped_recipes() -> list[str]:
    folder = resources.files("hetprune") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def resolve_recipe(path_or_name: str) -> Recipe:
    """A recipe file path, or the name of one shipped with hetprune."""
    path = Path(path_or_name)
    if path.is_file():
        return Recipe.read(path)
    if path_or_name in shipped_recipes():
        text = (resources.files("hetprune") / "recipes" / f"{path_or_name}.json").read_text()
        return Recipe.from_dict(json.loads(text), where=f"shipped recipe {path_or_name}")
    raise HetpruneError(f"--recipe {path_or_name!r} is neither a file nor a shipped recipe; "
                        f"shipped: {', '.join(shipped_recipes())}")


def _same_result(recipe: Recipe, state: dict):
    def check(folder: Path) -> bool:
        try:
            old = Recipe.read(folder / RECIPE_FILE)
            old_state = load_weights(folder / WEIGHTS_FILE)
        except HetpruneError:
            return False
        strip = lambda r: {k: v for k, v in r.to_dict().items() if k != "provenance"}  # noqa: E731
        return strip(old) == strip(recipe) and old_state.keys() == state.keys() and all(
            torch.equal(old_state[k], state[k]) for k in state)

    return check


def save(folder: str | Path, model: nn.Module, recipe: Recipe, overwrite: bool = False,
         extra_files: dict[str, object] | None = None) -> Path:
    """Write ``recipe.json`` + ``model.safetensors`` (+ extra JSON files) atomically."""
    from ..core.io import state_dict_for_saving

    state = state_dict_for_saving(model)
    with atomic_folder(folder, overwrite=overwrite, same_result=_same_result(recipe, state), kind=PRUNED_MODEL) as tmp:
        save_weights(tmp / WEIGHTS_FILE, state, metadata={"format": "hetprune", "schema": SCHEMA_VERSION})
        recipe.write(tmp / RECIPE_FILE)
        for name, data in (extra_files or {}).items():
            write_json_atomic(tmp / name, data)
    return Path(folder)


def load(folder: str | Path, allow_kwargs=(), model: nn.Module | None = None, adapter=None) -> nn.Module:
    """Rebuild a saved pruned model: fresh base architecture + recipe + weights.

    A folder is data: base kwargs that could make building the model read a
    file or the network (``checkpoint_path``, ``pretrained``, a
    ``pretrained_cfg_overlay`` with a file or URL, ...) are refused before
    anything is built, unless ``allow_kwargs`` names them (you trust the folder).

    ``model``: a fresh, unpruned base model you built (required when the
    recipe's base was user-built: hetprune cannot build your class); its
    weights are replaced by the saved ones. ``adapter``: the adapter it was
    pruned with, where no registered one serves it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise HetpruneError(f"{folder} is not a folder holding a pruned model ({RECIPE_FILE} + {WEIGHTS_FILE})")
    recipe = Recipe.read(folder / RECIPE_FILE)
    check_kwargs(recipe.base, allow_kwargs, f"recipe {folder / RECIPE_FILE}")
    model = build(recipe.base) if model is None else model
    apply_recipe(model, recipe, compute_merge=False, allow_kwargs=allow_kwargs, adapter=adapter)
    load_state_into(model, load_weights(folder / WEIGHTS_FILE), f"weights {folder / WEIGHTS_FILE}")
    return model.eval()


def load_recipe(folder: str | Path) -> Recipe:
    return Recipe.read(Path(folder) / RECIPE_FILE)
