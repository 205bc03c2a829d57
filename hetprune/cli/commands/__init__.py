"""Sub-commands of the ``hetprune`` CLI, one module each (``NAME_cmd.py``)."""
