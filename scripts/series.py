"""Apply, remove and export an upstream's patch series (``patches/<name>/*.patch``).

The series lives on the branch ``series/<version>`` of the checkout, applied on ``base/<version>`` with
``git am --3way`` under a fixed committer and ``--committer-date-is-author-date``, so the same series gives
the same commit ids everywhere. ``refs/kit/applied`` records the last commit ``git am`` made for the kit (the
gate records its own under ``refs/kit/`` too). A HEAD that is neither a base nor such a commit holds the
user's own work: it may be replaced only while ``patches/<name>/`` holds exactly that work (exporting it
again gives the same files), or when the user says ``--discard``.
"""

import re
import tempfile
from pathlib import Path

from scripts import KitError
from scripts.checkout import current_branch, git, has_ref, refuse_if_dirty, rev

APPLIED_REF = "refs/kit/applied"
COMMITTER_ENV = {"GIT_COMMITTER_NAME": "upstream kit", "GIT_COMMITTER_EMAIL": "kit@upstream.invalid"}
# Stable `git format-patch` output: no version signature, `[PATCH n/m]`, no commit ids.
FORMAT_PATCH = ["format-patch", "--quiet", "--no-signature", "--numbered", "--zero-commit"]


def patch_files(patch_dir: Path) -> list[Path]:
    """Return the ``*.patch`` files of ``patch_dir`` sorted by name (empty when the directory is missing)."""
    return sorted(patch_dir.glob("*.patch"))


def touches(patch: Path, paths: tuple[str, ...]) -> bool:
    """True when the ``git format-patch`` file ``patch`` changes a file under one of ``paths`` (``tests/``)."""
    changed = re.findall(r"^diff --git a/(\S+) b/", patch.read_text(errors="replace"), re.M)
    return any(name.startswith(paths) for name in changed)


def count(patches) -> str:
    """'1 patch' / 'N patches' for a sized collection of patches."""
    return f"{len(patches)} patch{'' if len(patches) == 1 else 'es'}"


def first_failing(repo: Path, base: str, patches: list[Path], *options: str) -> tuple[Path, str] | None:
    """Apply ``patches`` in order to ``base`` in a temporary index (``git apply --cached`` with ``options``).

    Neither the work tree nor the checkout's index changes. Returns (the first patch that fails, git's first
    error line), or None when all apply.
    """
    with tempfile.TemporaryDirectory(prefix="kit-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        for patch in patches:
            result = git(repo, "apply", "--cached", *options, str(patch), env=env, check=False)
            if result.returncode != 0:
                return patch, (result.stderr.strip().splitlines() or ["does not apply"])[0]
    return None


def branch(version: str) -> str:
    """Return the branch that carries the series on ``base/<version>``: ``series/<version>``."""
    return f"series/{version}"


def _exported(repo: Path, base: str, tip: str = "HEAD") -> dict[str, bytes]:
    """Return {file name: bytes} of what ``git format-patch`` makes of ``base..tip``."""
    with tempfile.TemporaryDirectory(prefix="kit-export-") as tmp:
        git(repo, *FORMAT_PATCH, "-o", tmp, f"{base}..{tip}")
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).glob("*.patch"))}


def matches(repo: Path, base: str, patch_dir: Path, tip: str = "HEAD") -> bool:
    """True when ``tip`` is on ``base`` and exporting ``base..tip`` gives exactly the files of ``patch_dir``."""
    if git(repo, "merge-base", "--is-ancestor", base, tip, check=False).returncode != 0:
        return False
    return _exported(repo, base, tip) == {p.name: p.read_bytes() for p in patch_files(patch_dir)}


def require_base(repo: Path, version: str) -> str:
    """Return ``base/<version>``; raise KitError when the checkout does not hold that base yet."""
    base = f"base/{version}"
    if not has_ref(repo, base):
        raise KitError(f"{repo} holds no {base} yet: run `make apply {repo.name.upper()}_VERSION={version}` first")
    return base


def refuse_if_unexported(repo: Path, version: str, patch_dir: Path, doing: str) -> None:
    """Raise KitError when HEAD or the branch ``series/<version>`` holds commits of the user's.

    A commit is the kit's own when a base tag or a ``refs/kit/*`` ref points at it; the user's commits are
    safe to replace only while exporting them gives exactly the files of ``patch_dir``.
    """
    base = f"base/{version}"
    tips = ["HEAD"] + ([f"refs/heads/{branch(version)}"] if has_ref(repo, f"refs/heads/{branch(version)}") else [])
    for tip in tips:
        commit = rev(repo, tip)
        if git(repo, "for-each-ref", "--points-at", commit, "refs/tags/base/", "refs/kit/").stdout:
            continue
        if not matches(repo, base, patch_dir, commit):
            where = "HEAD" if tip == "HEAD" else branch(version)
            raise KitError(f"{where} of {repo} ({commit[:12]}) holds commits that {patch_dir} does not: run `make "
                           f"export` to keep them, or `make unapply DISCARD=1` to drop them, before {doing}")


def apply(repo: Path, version: str, patch_dir: Path) -> str:
    """Check out ``series/<version>`` = ``base/<version>`` + every patch of ``patch_dir``; return a summary.

    A no-op when HEAD already carries exactly that series (but for putting the branch there). Raises KitError,
    changing nothing, when the checkout has uncommitted changes or unexported commits; when a patch does not
    apply, aborts ``git am``, leaves the checkout on the base and names the patch and the file.
    """
    base = f"base/{version}"
    refuse_if_dirty(repo, "applying the series")
    patches = patch_files(patch_dir)
    on = current_branch(repo)
    if matches(repo, base, patch_dir):
        if on != branch(version):  # e.g. a new checkout, detached at its base, and an empty series
            refuse_if_unexported(repo, version, patch_dir, "applying the series")
            git(repo, "checkout", "--quiet", "-B", branch(version))
        return f"{repo.name}: series already applied on {base} ({count(patches)}, HEAD {rev(repo)[:12]})"
    refuse_if_unexported(repo, version, patch_dir, "applying the series")
    git(repo, "checkout", "--quiet", "-B", branch(version), base)
    if patches:
        result = git(repo, "am", "--3way", "--committer-date-is-author-date",
                     *map(str, patches), env=COMMITTER_ENV, check=False)
        if result.returncode != 0:
            git(repo, "am", "--abort", check=False)
            git(repo, "checkout", "--quiet", "--detach", base)
            raise KitError(f"{_failed_patch(result.stdout + result.stderr, patches)} does not apply to "
                           f"{repo.name} {version}{_failed_file(result.stdout + result.stderr)}: the checkout "
                           f"was left on {base}; rebase the series (see README, 'Changing a patch')")
    git(repo, "update-ref", APPLIED_REF, "HEAD")
    return f"{repo.name}: applied {count(patches)} on {base}, HEAD {rev(repo)[:12]}"


def _failed_patch(output: str, patches: list[Path]) -> str:
    """Name the patch file of git am's 'Patch failed at NNNN subject' line (the first patch if none)."""
    found = re.search(r"Patch failed at (\d+)", output)
    index = int(found.group(1)) - 1 if found else 0
    return f"patches/{patches[index].parent.name}/{patches[index].name}" if index < len(patches) else "a patch"


def _failed_file(output: str) -> str:
    """Return ' (file: PATH)' for the first file git am names as failing, or '' when it names none."""
    for pattern in (r"error: patch failed: ([^:\n]+):", r"Merge conflict in (\S+)", r"error: ([^:\n]+): does not",
                    r"lacking or useless \(([^)\n]+)\)"):
        found = re.search(pattern, output)
        if found:
            return f" (file: {found.group(1)})"
    return ""


def unapply(repo: Path, version: str, patch_dir: Path, discard: bool = False) -> str:
    """Leave ``repo`` detached at ``base/<version>``; return a summary.

    Raises KitError, changing nothing, when the checkout has uncommitted changes, or, unless ``discard``,
    commits that are not exported to ``patch_dir``. With ``discard`` the branch ``series/<version>`` is reset
    to the base too, so such commits are dropped.
    """
    base = require_base(repo, version)
    refuse_if_dirty(repo, "unapplying")
    if discard:
        git(repo, "checkout", "--quiet", "--detach", base)
        git(repo, "branch", "--force", branch(version), base)
        return f"{repo.name}: at {base} ({rev(repo)[:12]}); commits above it dropped (git reflog still has them)"
    refuse_if_unexported(repo, version, patch_dir, "unapplying")
    git(repo, "checkout", "--quiet", "--detach", base)
    return f"{repo.name}: at {base} ({rev(repo)[:12]}), series not applied"


def refuse_if_off_series(repo: Path, version: str, doing: str) -> None:
    """Raise KitError unless HEAD is the branch ``series/<version>`` (where the kit and the user keep the series)."""
    on = current_branch(repo)
    if on != branch(version):
        raise KitError(f"{repo} is on {on or 'a detached HEAD'}, not {branch(version)}: run `make apply` (and make "
                       f"your commits there) before {doing}")


def resign(repo: Path, version: str) -> str:
    """Rewrite ``base/<version>..HEAD`` with the user's git identity as author and sole ``Signed-off-by``.

    Trees and order stay; each message keeps everything but its old ``Signed-off-by:`` lines. The user's
    identity is git's ``user.name`` / ``user.email``. Returns the identity. Raises KitError when git has no
    identity or the history above the base is not linear (``git format-patch`` could not export it anyway).
    """
    base = require_base(repo, version)
    refuse_if_dirty(repo, "re-signing (commit them with `git commit -s`)")
    refuse_if_off_series(repo, version, "re-signing")
    name = git(repo, "config", "user.name", check=False).stdout.strip()
    email = git(repo, "config", "user.email", check=False).stdout.strip()
    if not (name and email):
        raise KitError("git has no user.name / user.email: set them (git config --global user.name ...) to re-sign")
    commits = git(repo, "rev-list", "--reverse", "--topo-order", f"{base}..HEAD").stdout.split()
    if git(repo, "rev-list", "--merges", f"{base}..HEAD").stdout.strip():
        raise KitError(f"{repo} has merge commits above {base}: make the series linear before re-signing")
    identity = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": name,
                "GIT_COMMITTER_EMAIL": email}
    parent = rev(repo, base)
    for commit in commits:
        message = git(repo, "log", "-1", "--format=%B", commit).stdout
        kept = "\n".join(line for line in message.splitlines() if not line.startswith("Signed-off-by:"))
        signed = git(repo, "interpret-trailers", "--trailer", f"Signed-off-by: {name} <{email}>",
                     input=kept.rstrip() + "\n").stdout
        parent = git(repo, "commit-tree", f"{commit}^{{tree}}", "-p", parent, "-m", signed.rstrip(),
                     env=identity).stdout.strip()
    git(repo, "update-ref", "-m", "kit: re-sign the series", "HEAD", parent)
    return f"{name} <{email}>"


def export(repo: Path, version: str, patch_dir: Path) -> str:
    """Write ``base/<version>..HEAD`` as ``git format-patch`` files into ``patch_dir``; return a summary.

    Old ``*.patch`` files there are replaced. Raises KitError when the checkout has uncommitted changes
    (commit them first), is not on the branch ``series/<version>`` (so a checkout left on its base or on the
    gate's ``gate/before/<version>`` never overwrites the series) or that branch does not descend from the base.
    """
    base = require_base(repo, version)
    refuse_if_dirty(repo, "exporting (commit them with `git commit -s`)")
    refuse_if_off_series(repo, version, "exporting")
    if git(repo, "merge-base", "--is-ancestor", base, "HEAD", check=False).returncode != 0:
        raise KitError(f"{branch(version)} of {repo} does not descend from {base}: rebase it onto {base} first")
    files = _exported(repo, base)
    patch_dir.mkdir(parents=True, exist_ok=True)
    for old in patch_files(patch_dir):
        old.unlink()
    for name, data in files.items():
        (patch_dir / name).write_bytes(data)
    return f"{repo.name}: exported {count(files)} from {base}..HEAD to {patch_dir}"
