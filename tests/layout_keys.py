"""The resume keys a change of layout must not move (issue 41, item 7): the shipped models' base, structure
and configuration keys, a pruned and merged model's structure key (it names the modules surgery inserts), a
user Task's key (it names the functions it was given) and a compare row's key.

``python tests/layout_keys.py`` prints them (key version 2, tests/data/layout-keys-v2.json); tests/data/layout-keys.json
holds what the code printed at 15c341b, before hetprune/ became one subpackage per layer, under key version 1,
and test_layout.py compares both (each key's ``before`` with version 1's). Two keys were
recorded again on purpose when the selection split came (issue 43): the embedded task's (its data now holds
300 training images out) and the compare row's (its data, and hetdpt's new verify_by and verify_budget
settings); every other key is still the one of 15c341b."""

from __future__ import annotations

import json

import torch


def keys_now() -> dict:
    from hetprune.core import loader
    from hetprune.harness.compare.spec import CompareSpec, row_key
    from hetprune.model import surgery
    from hetprune.model.spec import DIGIT_PAIRS_SPEC, DIGITS_SPEC, model_hash
    from hetprune.pruning.budget import Budget
    from hetprune.training import embedded
    from hetprune.training.embedded_data import digits
    from hetprune.training.resume import base_key, config_key, structure_key
    from hetprune.training.task import Task, _cross_entropy, _top1, classification

    torch.manual_seed(0)
    out = {}
    for name, spec in (("digits", DIGITS_SPEC), ("digit-pairs", DIGIT_PAIRS_SPEC)):
        model = embedded.embedded_model(name, progress=False, log=lambda *_: None)
        out[name] = {"base": base_key(model, model_hash(model), spec), "structure": structure_key(model),
                     "config": config_key(model)}
        surgery.remove_attention(model, 0)
        surgery.remove_activation(model, 1)
        surgery.merge_all(model)
        out[name]["pruned_structure"] = structure_key(model, {"removed": ["attn0", "act1"]})
        out[name]["pruned_config"] = config_key(model)
    data = digits()
    task = classification(data)
    batches = [(torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long))]
    user = Task(batches, batches, loss=_cross_entropy, metric=_top1, metric_name="top1")
    out["tasks"] = {"embedded": task.key, "user": user.key}
    settings = loader.resolve(["hetdpt", "mix50"])
    spec = CompareSpec(["hetdpt", "mix50"], [Budget(sites=4)], [0], settings)
    out["compare_row"] = row_key(spec, "hetdpt", Budget(sites=4), 0, out["digits"]["base"], task.key)
    return out


if __name__ == "__main__":
    print(json.dumps(keys_now(), indent=1, sort_keys=True))   # a key is this release's string
