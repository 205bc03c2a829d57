"""The exceptions a user sees as one ``error:`` line.

The CLI prints these as a single clear line (no traceback); anything else is a
bug in hetprune and keeps its traceback.
"""

from contextlib import contextmanager


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


class ValReadWhileChoosing(HetpruneError):
    """The val set a result reports was read while a choice was made (`hetprune.core.contract.check_val_read`):
    a strategy's fault, not the user's input, so the conformance kit fails on it."""


# -- how messages name options: the command line's flags, or the Python call's arguments ---------------
_ON_COMMAND_LINE = False


@contextmanager
def command_line_messages():
    """Within this context (a ``hetprune`` command) messages name the command line's options; outside it
    (a Python call) they name the call's arguments."""
    global _ON_COMMAND_LINE
    before, _ON_COMMAND_LINE = _ON_COMMAND_LINE, True
    try:
        yield
    finally:
        _ON_COMMAND_LINE = before


def on_command_line() -> bool:
    """Whether a ``hetprune`` command is running (messages name its options)."""
    return _ON_COMMAND_LINE


def option(flag: str, value: str = "", setting: str | None = None, arg: str | None = None) -> str:
    """How an error names an option: ``--target-macs 0.5`` on the command line, ``target_macs=0.5`` in a
    Python call, or ``settings["cost_model"]`` where Python passes it as a setting (``setting``). ``arg`` is
    the Python argument where its name is not the flag's (``--int8-ops`` is ``ops=``)."""
    if _ON_COMMAND_LINE:
        return f"--{flag}" + (f" {value}" if value else "")
    if setting is not None:
        return f'settings["{setting}"]' + (f" = {value!r}" if value else "")
    name = arg or flag.replace("-", "_")
    return f"{name}={value}" if value else name


def switch(flag: str, arg: str | None = None) -> str:
    """An on/off option: ``--overwrite`` on the command line, ``overwrite=True`` in a Python call (``arg``:
    the Python argument where its name is not the flag's)."""
    return f"--{flag}" if _ON_COMMAND_LINE else f"{arg or flag.replace('-', '_')}=True"
