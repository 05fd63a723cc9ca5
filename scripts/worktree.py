"""Throw-away trees of an upstream checkout: where the gate's stages, ``make stress`` and the bench's base side run.

A tree is a repository of its own under a root directory of the kit's ``build/``: ``git clone --shared
--no-checkout`` of the checkout (its objects are read through ``objects/info/alternates``, nothing is copied),
then a detached checkout of the commit asked for. Nothing is written into the checkout: not its HEAD, index, work
tree, branches or tags, and no ``git worktree`` record (issue 22: ``git worktree list`` of the checkout stays as it
was, even when a run is killed). Commits made in a tree (``git am``) are objects of the tree's own repository;
removing the tree is removing its directory. Hooks of the user's are not run (``core.hooksPath=/dev/null``).
"""

import shutil
from pathlib import Path

from scripts import series
from scripts.git import git, rev

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
    """Remove ``root`` (trees of a run that was killed) and the ``git worktree`` records of ``repo`` under it (the
    kit made its trees so before issue 22); work trees elsewhere are left alone. Raises KitError when git fails."""
    root = root.resolve()
    stale = [path for path in listed(repo) if path.resolve().is_relative_to(root)]
    for path in stale:
        git(repo, "worktree", "remove", "--force", "--force", str(path), check=False)
    if stale:
        git(repo, "worktree", "prune")
    shutil.rmtree(root, ignore_errors=True)


def add(repo: Path, path: Path, commit: str) -> Path:
    """A new tree of ``repo`` (a shared clone, see above) at ``commit`` in ``path`` (anything there first removed),
    detached; returns path.

    A fresh directory every time, so that no bytecode (``__pycache__``) of another tree or run can be imported
    (issue 12: a ``.pyc`` is trusted when the source's mtime and size match, which two same-sized versions written
    within one second do). Raises KitError when git cannot make it.
    """
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "clone", "--quiet", "--shared", "--no-checkout", str(repo.resolve()), str(path), env=NO_HOOKS)
    git(path, "checkout", "--quiet", "--detach", rev(repo, commit), env=NO_HOOKS)
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


def remove(path: Path) -> None:
    """Remove the tree ``path`` (its directory: no record of it exists elsewhere); never raises."""
    shutil.rmtree(path, ignore_errors=True)
