"""Throw-away ``git worktree``s of an upstream checkout: where the gate's stages and the bench's base side run.

A work tree is detached (no branch is made or moved) and lives under a root directory of the kit's ``build/``; the
checkout itself (its HEAD, index, work tree, branches and tags) is never written. What git does write into the
checkout's ``.git`` is the work tree's administrative entry (``.git/worktrees/<id>``) and the objects of commits
made in the work tree, which no ref keeps. Hooks of the user's are not run (``core.hooksPath=/dev/null``).
"""

import shutil
from pathlib import Path

from scripts import KitError, series
from scripts.git import git

# Environment of every git command in a work tree: no hooks of the user's, no rerere.
NO_HOOKS = {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/dev/null",
            "GIT_CONFIG_KEY_1": "rerere.enabled", "GIT_CONFIG_VALUE_1": "false"}


def package_dir(tree: Path, package: str) -> Path:
    """The directory of a source ``tree`` that holds the importable ``package``: ``src/`` (Accelerate's layout) or the
    tree itself (DeepSpeed's); the one to put on ``PYTHONPATH``."""
    return tree / "src" if (tree / "src" / package).is_dir() else tree


def listed(repo: Path) -> list[Path]:
    """The paths of the work trees git records for ``repo`` (the main one excluded)."""
    lines = git(repo, "worktree", "list", "--porcelain").stdout.splitlines()
    paths = [Path(line.removeprefix("worktree ")) for line in lines if line.startswith("worktree ")]
    return paths[1:]


def clean(repo: Path, root: Path) -> None:
    """Remove every work tree of ``repo`` under ``root`` (leftovers of a run that was killed) and git's records of
    them; work trees elsewhere are left alone. Raises KitError when git fails."""
    root = root.resolve()
    for path in listed(repo):
        if path.resolve().is_relative_to(root):
            git(repo, "worktree", "remove", "--force", "--force", str(path), check=False)
            shutil.rmtree(path, ignore_errors=True)
    git(repo, "worktree", "prune")


def add(repo: Path, path: Path, commit: str) -> Path:
    """A new detached work tree of ``repo`` at ``commit`` in ``path`` (anything there first removed); returns path.

    A fresh directory every time, so that no bytecode (``__pycache__``) of another tree or run can be imported
    (issue 12: a ``.pyc`` is trusted when the source's mtime and size match, which two same-sized versions written
    within one second do). Raises KitError when git cannot make it.
    """
    if path.exists():
        git(repo, "worktree", "remove", "--force", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
        git(repo, "worktree", "prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "add", "--quiet", "--detach", str(path), commit, env=NO_HOOKS)
    return path


def apply_series(tree: Path, patches: list[Path]) -> str:
    """``git am --3way`` the ``patches`` in the work tree ``tree`` as ``make apply`` does (the kit's committer, the
    author dates: the same commit ids); return '' when they apply, else where it failed (``git am`` aborted)."""
    if not patches:
        return ""
    result = git(tree, "am", "--3way", "--committer-date-is-author-date", *map(str, patches),
                 env={**series.COMMITTER_ENV, **NO_HOOKS}, check=False)
    if result.returncode == 0:
        return ""
    output = result.stdout + result.stderr
    git(tree, "am", "--abort", check=False)
    return f"{series._failed_patch(output, patches)}{series._failed_file(output)}"


def remove(repo: Path, path: Path) -> None:
    """Remove the work tree ``path`` of ``repo`` and git's record of it; never raises."""
    try:
        git(repo, "worktree", "remove", "--force", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)
    except (KitError, OSError):
        pass
