"""The exceptions a user sees as one ``error:`` line.

The CLI prints these as a single clear line (no traceback); anything else is a
bug in hetprune and keeps its traceback.
"""


class HetpruneError(Exception):
    """Bad input or state that the user can fix: the message says what and how."""


class PluginError(HetpruneError):
    """A plugin's component broke the plugin contract or raised: names who, where and what.

    ``plugin`` describes the plugin (name, distribution, version), ``kind`` and
    ``component`` name the component, ``stage`` the pipeline stage and method.
    The original exception, if any, is the ``__cause__`` (``--debug`` shows it).
    """

    def __init__(self, message: str, plugin: str = "", kind: str = "", component: str = "", stage: str = ""):
        super().__init__(message)
        self.plugin, self.kind, self.component, self.stage = plugin, kind, component, stage

    def __reduce__(self):  # survives the trip back from a ``compare --jobs`` worker process
        return (type(self), (str(self), self.plugin, self.kind, self.component, self.stage))


class BudgetUnreachable(HetpruneError):
    """A strategy cannot meet the budget on this model (attention sites alone cannot reach a MAC target,
    say). ``prune`` reports it as an error; ``compare`` shows it in that strategy's row and goes on."""
