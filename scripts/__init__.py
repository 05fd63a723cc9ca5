"""The kit's own tooling: pinned upstream checkouts, the patch series, the gate (Python 3.11 stdlib, pip, git)."""


def last_line(text: str) -> str:
    """The last non-blank line of a tool's output, stripped ('' when there is none): what went wrong, for errors."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class KitError(Exception):
    """A failure the user can act on; its message is one line that says what to do."""
