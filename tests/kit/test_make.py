"""The Makefile's own checks: a missing Python 3.11 is one line, and `make help` lists every target."""

import re
import subprocess

from scripts.sources import KIT_ROOT


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), *args], capture_output=True,
                          text=True, timeout=60)


def test_missing_python_is_one_line():
    result = make("check-python", "PYTHON=/nonexistent/python3.11")
    assert result.returncode != 0
    assert result.stderr.splitlines()[0] == (
        "error: /nonexistent/python3.11 is not Python 3.11: install it or run make PYTHON=/path/to/python3.11")


def test_wrong_python_version_is_refused():
    # Another Python answers the version check with exit status 1, as /bin/false does.
    result = make("check-python", "PYTHON=/bin/false")
    assert result.returncode != 0 and "is not Python 3.11" in result.stderr


def test_help_lists_every_target():
    makefile = (KIT_ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):.*## ", makefile, re.M))
    listed = set(re.findall(r"^  ([a-z][a-z-]*) ", make("help").stdout, re.M))
    assert targets and targets == listed
