"""An outside hetprune plugin: registers the ``nearest`` accuracy predictor.

hetprune finds this module through the entry point in ``pyproject.toml``
(group ``hetprune``) and calls the hooks below, which are marked with
``hetprune.hookimpl`` and named exactly as in ``hetprune/core/hookspecs.py``.
"""

import hetprune

from .predictor import NearestPredictor

__version__ = "0.1.0"


@hetprune.hookimpl
def register_predictors(register):
    register(NearestPredictor)
