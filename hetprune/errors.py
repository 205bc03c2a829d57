"""One exception type for every mistake a user can make.

The CLI prints these as a single clear line (no traceback); anything else is a
bug and keeps its traceback.
"""


class HetpruneError(Exception):
    """Bad input or state that the user can fix: the message says what and how."""
