"""The kit's own tooling: pinned upstream checkouts, the patch series, the gate (Python 3.11 stdlib, pip, git)."""

import argparse


def last_line(text: str) -> str:
    """The last non-blank line of a tool's output, stripped ('' when there is none): what went wrong, for errors."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class KitError(Exception):
    """A failure the user can act on; its message is one line that says what to do."""


def plural(n: int, word: str, words: str = "") -> str:
    """``'1 path'`` / ``'2 paths'``: ``n`` and ``word`` in the right number (``words``: an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line that says what to do, not its usage (issue 33:
    ``make bench BENCH_ARGS='--repeat x'`` printed five lines); exit status 2, as argparse's."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}: `{self.prog} --help` lists the options\n")
