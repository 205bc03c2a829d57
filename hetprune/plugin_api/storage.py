"""What a component keeps on disk and takes back on ``--resume``, in one namespace of the plugin API
(``from hetprune.plugin_api import storage``; ``storage.fingerprint(...)``).

Stored results are found by a key made from everything that shaped them; hetprune's own keys changed once
(key version 2), so a store also looks where version 1 put the same result. A plugin that stores nothing
needs none of this.

* Keys: `fingerprint` (a `Key`: this release's key, with ``before``, the key version 1 made), `before`,
  `found` (the path to read: this release's, else version 1's where only that exists), `matches` (a stored
  key is this one, under either version).
* Checkpoints: `weights_key` (a hash of a model's weights), `reusable` (a stored checkpoint's key against
  this run's, saying what differs), `save_torch_atomic` (a file whole or not at all), `note_saved` (so an
  interrupted command can say that there is work to resume), `now` and `made_when` (when it was saved).
* Measured points: `PointStore` (JSON-lines, one line per point, keyed by the settings) and `metric_of`
  (a point's metric).

Every name is a re-export; the functions keep their modules.
"""

from __future__ import annotations

from ..core.io import made_when, note_saved, now, save_torch_atomic
from ..core.keys import Key, before, fingerprint, found, matches
from ..pruning.point_store import PointStore, metric_of
from ..training.resume import reusable, weights_key

__all__ = ["Key", "before", "fingerprint", "found", "matches", "weights_key", "reusable", "save_torch_atomic",
           "note_saved", "now", "made_when", "PointStore", "metric_of"]
