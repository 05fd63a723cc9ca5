"""Run git on a repository and read a few facts from it (the one place the kit calls the git program).

Every command gets ``PORTABLE`` config, so a tree hashes the same on every machine whatever the user's git
config says. Used by checkout.py, series.py and the other scripts.
"""

import os
import shutil
import subprocess
from pathlib import Path

from scripts import KitError, last_line

# Config that would make the same tree hash differently on another machine.
PORTABLE = ["-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "core.symlinks=true"]


def git(repo: Path, *args: str, env: dict | None = None, check: bool = True, input: str | None = None
        ) -> subprocess.CompletedProcess:
    """Run ``git -C repo args`` (``input`` on stdin) and return the completed process (text stdout/stderr).

    Raises KitError naming the command and git's last error line when ``check`` and git exits non-zero,
    or when git is not installed.
    """
    if shutil.which("git") is None:
        raise KitError("git is not installed: install git (apt-get install git) and run again")
    result = subprocess.run(["git", "-C", str(repo), *PORTABLE, *args], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, input=input)
    if check and result.returncode != 0:
        reason = last_line(result.stderr or result.stdout) or f"exit {result.returncode}"
        raise KitError(f"git {args[0]} failed in {repo}: {reason}")
    return result


def has_ref(repo: Path, ref: str) -> bool:
    """Return True when ``ref`` names a commit in ``repo``."""
    return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).returncode == 0


def rev(repo: Path, ref: str = "HEAD") -> str:
    """Return the full commit id of ``ref`` in ``repo``; raise KitError if it names no commit."""
    return git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").stdout.strip()


def current_branch(repo: Path) -> str:
    """Return the short name of the branch HEAD is on, or '' for a detached HEAD."""
    return git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.strip()
