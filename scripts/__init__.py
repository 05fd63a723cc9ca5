"""The kit's own tooling: pinned upstream checkouts, the patch series, the gate (Python 3.11 stdlib, pip, git)."""


class KitError(Exception):
    """A failure the user can act on; its message is one line that says what to do."""
