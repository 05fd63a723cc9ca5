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


def test_every_pip_install_of_make_apply_says_what_it_does_every_period():
    """Issue 22, item 4: `make apply` printed nothing for 40 s while pip built the editable installs, and 47 s while it
    made the checkouts under load. Every recipe line of `make apply` that runs pip (the venv's packages, the sdists'
    download, the checkouts' editable installs) goes through the
    lock's ``--say``, which prints what it does at the start and every 30 s (tests/kit/test_progress.py)."""
    lines = make("-n", "apply", "VENV=/nonexistent/kit-venv").stdout.splitlines()  # a venv still to make
    installs = [line for line in lines if "pip install" in line
                or "scripts.upstream" in line and "--check-only" not in line]  # a check takes a second
    assert any("scripts.upstream install" in line for line in installs), lines
    assert any("scripts.upstream apply" in line for line in installs), lines  # downloads the sdists (47 s silent)
    assert installs and all("--say" in line for line in installs), installs


def test_lint_is_given_its_tools_by_an_absolute_path():
    """scripts.lint runs the style tools inside each checkout: a relative TOOLS (the default `.tools`) would not be
    found there (`make lint` failed with FileNotFoundError: '.tools/bin/yapf' when the Makefile passed it as given)."""
    printed = make("-n", "lint").stdout.splitlines()
    lines = [line for line in printed if "scripts.lint" in line and "--ready" not in line]
    assert lines and all(f"--tools {KIT_ROOT / '.tools'}" in line for line in lines), lines
