"""Make and inspect the git checkout of an upstream under ``upstream/<name>/``.

The pristine tree of every pinned version is one root commit tagged ``base/<version>`` (README, "How
checkouts are made"). It is written with git plumbing from a temporary index, so the work tree is not
touched, and with a fixed identity and date, so two machines make the same commit id from the same sdist.
"""

import shutil
import tempfile
from pathlib import Path

from scripts import KitError, last_line, plural, sdist
from scripts.git import git, has_ref, rev
from scripts.sources import Pin

# Identity and date of every base commit: fixed so that the commit id depends on the tree alone.
BASE_ENV = {
    "GIT_AUTHOR_NAME": "upstream sdist",
    "GIT_AUTHOR_EMAIL": "sdist@upstream.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "upstream sdist",
    "GIT_COMMITTER_EMAIL": "sdist@upstream.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
# What builds, editable installs and test runs write into a checkout; kept out of `git status`.
EXCLUDES = ["*.egg-info/", "__pycache__/", "*.py[cod]", "/build/", ".pytest_cache/", ".ruff_cache/"]


def base_tag(version: str) -> str:
    """Return the tag of the pristine commit of ``version``: ``base/<version>``."""
    return f"base/{version}"


def uncommitted(repo: Path) -> list[str]:
    """Return ``git status --porcelain`` lines of ``repo``: edits and untracked files (not ignored ones)."""
    return git(repo, "status", "--porcelain").stdout.splitlines()


# Files git keeps while an operation is under way in a repository (``git am`` stopped, a rebase or merge).
IN_PROGRESS = {"rebase-apply": "git am or rebase", "rebase-merge": "rebase", "MERGE_HEAD": "merge",
               "CHERRY_PICK_HEAD": "cherry-pick", "REVERT_HEAD": "revert"}


def refuse_if_dirty(repo: Path, doing: str) -> None:
    """Raise KitError, touching nothing, when ``repo`` holds uncommitted edits, untracked files, or an
    unfinished ``git am`` / rebase / merge / cherry-pick / revert."""
    for name, operation in IN_PROGRESS.items():
        if (repo / ".git" / name).exists():
            raise KitError(f"{repo} has a {operation} in progress: finish it or abort it (e.g. `git am --abort`) "
                           f"before {doing}")
    dirty = uncommitted(repo)
    if dirty:
        raise KitError(f"{repo} has uncommitted changes ({plural(len(dirty), 'path')}, e.g. '{dirty[0][3:]}'): commit "
                       f"them or move them away (`git stash --include-untracked`) before {doing}")


def ensure_repo(repo: Path) -> None:
    """Create ``repo`` as an empty git repository with the kit's excludes, or check that it is one.

    Raises KitError when ``repo`` exists but is not a git repository (it is never overwritten).
    """
    if (repo / ".git").is_dir():
        return
    if repo.exists() and any(repo.iterdir()):
        raise KitError(f"{repo} exists but is not a git checkout made by the kit: move it away and run again")
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "--quiet")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("".join(f"{p}\n" for p in EXCLUDES))


def commit_tree(repo: Path, tree: Path, message: str) -> str:
    """Commit the files of directory ``tree`` as a root commit of ``repo`` with BASE_ENV; return its id.

    Uses a temporary index, so neither the work tree nor the index of ``repo`` changes. Every file is
    taken, even one that a ``.gitignore`` inside ``tree`` names.
    """
    with tempfile.TemporaryDirectory(prefix="kit-index-") as tmp:
        env = {**BASE_ENV, "GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(tree)}
        git(repo, "add", "--all", "--force", ".", env=env)
        tree_id = git(repo, "write-tree", env=env).stdout.strip()
        return git(repo, "commit-tree", tree_id, "-m", message, env=env).stdout.strip()


def fetch_tag(pin: Pin, repo: Path) -> None:
    """Fetch the commit of ``pin.tag`` from ``pin.git`` (depth 1) into ``repo`` as the tag ``base/<version>``.

    Raises KitError naming the URL and the tag when git cannot fetch it (no network, no such tag).
    """
    refspec = f"+refs/tags/{pin.tag}:refs/tags/{base_tag(pin.version)}"
    result = git(repo, "fetch", "--quiet", "--depth=1", "--no-tags", pin.git, refspec, check=False)
    if result.returncode != 0:
        raise KitError(f"cannot fetch tag {pin.tag} of {pin.name} from {pin.git} ({last_line(result.stderr)}): check "
                       f"the network and the pin, or use the sdist source (SOURCE=sdist)")


def make_base(pin: Pin, repo: Path, cache_dir: Path, pip_options: list[str] = (), source: str = "sdist") -> str:
    """Make sure ``repo`` holds ``pin``'s pristine tree as a commit tagged ``base/<version>``.

    ``source="sdist"``: downloads (or takes from ``cache_dir``) and verifies the sdist, only when the tag is
    missing; the ``*.egg-info`` metadata that setuptools writes into an sdist is left out (an editable
    install rewrites it). ``source="git"``: the upstream's own commit of ``pin.tag`` (see fetch_tag). An
    existing ``base/<version>`` is kept whatever its source. A new, empty checkout is left detached at the
    base. Returns the base commit id. Raises KitError from sdist.fetch / sdist.extract / git.
    """
    ensure_repo(repo)
    tag = base_tag(pin.version)
    if not has_ref(repo, tag) and source == "git":
        fetch_tag(pin, repo)
    if not has_ref(repo, tag):
        archive = sdist.fetch(pin, cache_dir, pip_options)
        with tempfile.TemporaryDirectory(prefix="kit-extract-") as tmp:
            top = sdist.extract(archive, Path(tmp) / "sdist")
            for egg_info in top.rglob("*.egg-info"):
                shutil.rmtree(egg_info)
            message = f"{pin.package} {pin.version}: pristine sdist {pin.sdist}\n\nsha256 {pin.sha256}\n"
            git(repo, "tag", tag, commit_tree(repo, top, message))
    if git(repo, "rev-parse", "--verify", "--quiet", "HEAD", check=False).returncode != 0:
        git(repo, "checkout", "--quiet", "--detach", tag)
    return rev(repo, tag)
