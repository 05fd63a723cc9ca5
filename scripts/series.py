"""Apply, remove and export an upstream's patch series (``patches/<name>/*.patch``).

The series lives on the branch ``series/<version>`` of the checkout, applied on ``base/<version>`` with
``git am --3way`` under a fixed committer and ``--committer-date-is-author-date``, so the same series gives
the same commit ids everywhere. ``refs/kit/series/<version>`` records the last commit ``git am`` made for the kit
from ``patches/<name>/`` (the gate's ``refs/kit/gate-*`` commits are the kit's too). A commit that is neither a
base nor such a record holds the user's own work: it may be replaced only while ``patches/<name>/`` holds exactly
that work (exporting it again gives the same files), or when the user says ``--discard``.

Nothing re-makes the user's commits under a kit record: when ``series/<version>`` already carries exactly the
series, ``apply`` checks that branch out instead of running ``git am`` again, so after ``make export`` the
exported commits stay the user's whatever runs next (gate, matrix, apply of another version), and a later
``git checkout patches/`` in the kit cannot make ``apply`` drop them (issue 14).

Every command is split in a check that raises KitError and changes nothing (``check_apply``, ``check_unapply``,
``check_export``) and the change itself, so that ``scripts/upstream.py`` can check every upstream before it
changes any.
"""

import contextlib
import re
import tempfile
from pathlib import Path

from scripts import KitError, plural
from scripts.checkout import IN_PROGRESS, refuse_if_dirty, uncommitted
from scripts.git import current_branch, git, has_ref, rev

# Refs whose commits the kit made and may replace: the bases, the series `git am` made, the gate's commits.
KIT_REFS = ["refs/tags/base/", "refs/kit/series/", "refs/kit/gate-*"]
# Where earlier kits recorded the applied series: it could end up on the user's exported commits, so it is deleted.
LEGACY_REF = "refs/kit/applied"
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
    return plural(len(patches), "patch", "patches")


def applied_ref(version: str) -> str:
    """The ref that records the last series ``git am`` made on ``base/<version>``: ``refs/kit/series/<version>``."""
    return f"refs/kit/series/{version}"


def first_failing(repo: Path, base: str, patches: list[Path], *options: str) -> tuple[Path, str] | None:
    """Apply ``patches`` in order to ``base`` in a temporary index (``git apply --cached`` with ``options``).

    Neither the work tree nor the checkout's index changes. Returns (the first patch that fails, git's error
    output), or None when all apply.
    """
    with tempfile.TemporaryDirectory(prefix="kit-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        for patch in patches:
            result = git(repo, "apply", "--cached", *options, str(patch), env=env, check=False)
            if result.returncode != 0:
                return patch, result.stderr.strip() or "does not apply"
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


def has_base(repo: Path, version: str) -> bool:
    """True when ``repo`` is a git checkout that holds ``base/<version>``."""
    return (repo / ".git").is_dir() and has_ref(repo, f"base/{version}")


def require_base(repo: Path, version: str) -> str:
    """Return ``base/<version>``; raise KitError when the checkout does not hold that base yet."""
    base = f"base/{version}"
    if not has_ref(repo, base):
        raise KitError(f"{repo} holds no {base} yet: run `make apply {repo.name.upper()}_VERSION={version}` first")
    return base


def kit_made(repo: Path, commit: str) -> bool:
    """True when one of KIT_REFS points at ``commit``: a base or a commit the kit made, safe to replace."""
    return bool(git(repo, "for-each-ref", "--points-at", commit, *KIT_REFS).stdout.strip())


def refuse_if_unexported(repo: Path, version: str, patch_dir: Path, doing: str, tips: tuple[str, ...] = ()) -> None:
    """Raise KitError when HEAD or the branch ``series/<version>`` (or only ``tips``) holds commits of the user's.

    A commit is the kit's own when a ref of KIT_REFS points at it; the user's commits are safe to replace only
    while exporting them (from the base they stand on) gives exactly the files of ``patch_dir``.
    """
    ref = f"refs/heads/{branch(version)}"
    tips = tips or ("HEAD", *([ref] if has_ref(repo, ref) else []))
    for tip in tips:
        commit = rev(repo, tip)
        on = version_of(repo, commit)  # HEAD may stand on another version's base (`make apply X_VERSION=...`)
        if kit_made(repo, commit) or (on and matches(repo, f"base/{on}", patch_dir, commit)):
            continue
        where = "HEAD" if tip == "HEAD" else branch(version)
        raise KitError(f"{where} of {repo} ({commit[:12]}) holds commits that {patch_dir} does not: run `make "
                       f"export` to keep them, or `make unapply DISCARD=1` to drop them, before {doing}")


def check_apply(repo: Path, version: str, patch_dir: Path, keep_conflict: bool = False) -> str:
    """Raise KitError, changing nothing, when ``apply`` would have to refuse; else return what it will do.

    Returns ``"done"`` (HEAD carries exactly the series), ``"switch"`` (the branch ``series/<version>`` does:
    check it out) or ``"am"`` (the series is applied anew with ``git am``; every patch was checked to apply
    to the base with ``git apply --3way`` in a temporary index). A patch that does not apply is refused with
    ``conflict_message`` unless ``keep_conflict`` (then ``git am`` is to stop there for the user).
    """
    base = require_base(repo, version)
    refuse_if_dirty(repo, "applying the series")
    ref = f"refs/heads/{branch(version)}"
    if matches(repo, base, patch_dir):
        if current_branch(repo) != branch(version):  # e.g. a new checkout, detached at its base, and an empty series
            refuse_if_unexported(repo, version, patch_dir, "applying the series")
        return "done"
    refuse_if_unexported(repo, version, patch_dir, "applying the series", ("HEAD",))
    if has_ref(repo, ref) and matches(repo, base, patch_dir, ref):
        return "switch"
    refuse_if_unexported(repo, version, patch_dir, "applying the series")
    failed = first_failing(repo, base, patch_files(patch_dir), "--3way")
    if failed and not keep_conflict:
        raise KitError(conflict_message(repo, version, failed[0], failed_files(failed[1])))
    return "am"


class KeptConflict(KitError):
    """``git am`` stopped at a patch that does not apply and was left so, as ``KEEP_CONFLICT=1`` asked."""


def conflict_message(repo: Path, version: str, patch: Path, files: list[str], kept: bool = False,
                     left: str = "") -> str:
    """The one line of a patch that does not apply with ``git am --3way``: the patch, the files, and the next
    commands; ``kept``: ``git am`` was left stopped at it in ``repo`` (``make apply KEEP_CONFLICT=1``); ``left``:
    where the checkout is otherwise, when it moved (issue 30)."""
    where = f"patches/{patch.parent.name}/{patch.name} does not apply to {repo.name} {version}" + (
        f" (conflicts in {', '.join(files)})" if files else "")
    choose = f"{repo.name.upper()}_VERSION={version}"
    finish = (f"resolve the files, `git add` them and run `git am --continue` in {repo} (`git am --abort` gives up), "
              f"then `make export {choose}` and `make gate {choose}`")
    if kept:
        number = int(patch.name.split("-")[0]) if patch.name.split("-")[0].isdigit() else 0
        before = f"patches 1..{number - 1} applied" if number > 1 else "no patch applied before it"
        return (f"{where}: git am stopped there in {repo} on {branch(version)} ({before}), as KEEP_CONFLICT=1 "
                f"asked; {finish}")
    return (f"{where}: {left + '; ' if left else ''}to rebase the series there, run `make apply {choose} "
            f"KEEP_CONFLICT=1` (git am stops at this patch), {finish} (README, 'Changing a patch')")


def apply(repo: Path, version: str, patch_dir: Path, keep_conflict: bool = False) -> str:
    """Check out ``series/<version>`` = ``base/<version>`` + every patch of ``patch_dir``; return a summary.

    A no-op when HEAD already carries exactly that series (but for putting the branch there); checks out the
    branch ``series/<version>`` when it carries exactly the series (no ``git am``, so the user's exported commits
    stay the user's). Raises KitError, changing nothing, in the cases of ``check_apply``; when ``git am`` fails
    all the same (or is interrupted), aborts it, leaves the checkout on the base and names the patch and the files.
    With ``keep_conflict`` a patch that does not apply leaves ``git am`` stopped at it on ``series/<version>``, its
    conflicts in the work tree, and raises KitError saying how to go on (``conflict_message``); an interrupt still
    aborts.
    """
    base = f"base/{version}"
    patches = patch_files(patch_dir)
    step = check_apply(repo, version, patch_dir, keep_conflict)
    git(repo, "update-ref", "-d", LEGACY_REF, check=False)
    if step == "done":
        if current_branch(repo) != branch(version):
            git(repo, "checkout", "--quiet", "-B", branch(version))
        return f"{repo.name}: series already applied on {base} ({count(patches)}, HEAD {rev(repo)[:12]})"
    if step == "switch":
        git(repo, "checkout", "--quiet", branch(version))
        return f"{repo.name}: checked out {branch(version)}, which carries the series ({count(patches)}, HEAD " \
               f"{rev(repo)[:12]})"
    git(repo, "checkout", "--quiet", "-B", branch(version), base)
    if patches:
        try:
            result = git(repo, "am", "--3way", "--committer-date-is-author-date",
                         *map(str, patches), env=COMMITTER_ENV, check=False)
        except KeyboardInterrupt:
            result = None
        if result is not None and result.returncode != 0 and keep_conflict:
            output = result.stdout + result.stderr
            unmerged = git(repo, "diff", "--name-only", "--diff-filter=U").stdout.split()
            raise KeptConflict(conflict_message(repo, version, _failed(output, patches),
                                                unmerged or failed_files(output), kept=True))
        if result is None or result.returncode != 0:
            git(repo, "am", "--abort", check=False)
            git(repo, "checkout", "--quiet", "--detach", base)
            if result is None:
                raise KeyboardInterrupt
            output = result.stdout + result.stderr
            raise KitError(conflict_message(repo, version, _failed(output, patches), failed_files(output),
                                            left=f"the checkout was left on {base}"))
    git(repo, "update-ref", applied_ref(version), "HEAD")
    return f"{repo.name}: applied {count(patches)} on {base}, HEAD {rev(repo)[:12]}"


def _failed(output: str, patches: list[Path]) -> Path:
    """The patch file of git am's 'Patch failed at NNNN subject' line (the first patch if none)."""
    found = re.search(r"Patch failed at (\d+)", output)
    index = int(found.group(1)) - 1 if found else 0
    return patches[min(index, len(patches) - 1)]


def _failed_patch(output: str, patches: list[Path]) -> str:
    """``patches/<name>/<file>`` of the patch git am's output names as failing (scripts/worktree.py)."""
    patch = _failed(output, patches)
    return f"patches/{patch.parent.name}/{patch.name}"


FAILED_FILE = (r"error: patch failed: ([^:\n]+):", r"Merge conflict in (\S+)", r"error: ([^:\n]+): does not",
               r"lacking or useless \(([^)\n]+)\)", r"Applied patch to '([^'\n]+)' with conflicts")


def failed_files(output: str) -> list[str]:
    """Every file that git am's or git apply's output names as failing or conflicting, in order, once each."""
    found = [(m.start(), m.group(1)) for pattern in FAILED_FILE for m in re.finditer(pattern, output)]
    return list(dict.fromkeys(name for _, name in sorted(found)))


def _failed_file(output: str) -> str:
    """Return ' (file: PATH)' for the first file git am names as failing, or '' when it names none."""
    files = failed_files(output)
    return f" (file: {files[0]})" if files else ""


def check_unapply(repo: Path, version: str, patch_dir: Path, discard: bool = False) -> None:
    """Raise KitError, changing nothing, when ``unapply`` would have to refuse (see there)."""
    require_base(repo, version)
    refuse_if_dirty(repo, "unapplying")
    if not discard:
        refuse_if_unexported(repo, version, patch_dir, "unapplying")


def unapply(repo: Path, version: str, patch_dir: Path, discard: bool = False) -> str:
    """Leave ``repo`` detached at ``base/<version>``; return a summary.

    Raises KitError, changing nothing, when the checkout has uncommitted changes, or, unless ``discard``,
    commits that are not exported to ``patch_dir``. With ``discard`` the branch ``series/<version>`` is reset
    to the base too, so such commits are dropped.
    """
    base = f"base/{version}"
    check_unapply(repo, version, patch_dir, discard)
    unexported = False  # whether DISCARD drops commits of the user's, or only the kit's series (issue 22)
    if discard:
        try:
            refuse_if_unexported(repo, version, patch_dir, "unapplying")
        except KitError:
            unexported = True
    git(repo, "checkout", "--quiet", "--detach", base)
    if discard:
        git(repo, "branch", "--force", branch(version), base)
    if unexported:
        return (f"{repo.name}: at {base} ({rev(repo)[:12]}); commits not in {patch_dir} dropped (git reflog still "
                "has them)")
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


def check_export(repo: Path, version: str) -> None:
    """Raise KitError, changing nothing, when ``export`` would have to refuse (see there)."""
    base = require_base(repo, version)
    refuse_if_dirty(repo, "exporting (commit them with `git commit -s`)")
    refuse_if_off_series(repo, version, "exporting")
    if git(repo, "merge-base", "--is-ancestor", base, "HEAD", check=False).returncode != 0:
        raise KitError(f"{branch(version)} of {repo} does not descend from {base}: rebase it onto {base} first")


def export(repo: Path, version: str, patch_dir: Path) -> str:
    """Write ``base/<version>..HEAD`` as ``git format-patch`` files into ``patch_dir``; return a summary.

    Old ``*.patch`` files there are replaced. Raises KitError when the checkout has uncommitted changes
    (commit them first), is not on the branch ``series/<version>`` (so a checkout left on its base or on the
    gate's ``gate/before/<version>`` never overwrites the series) or that branch does not descend from the base.
    """
    base = f"base/{version}"
    check_export(repo, version)
    files = _exported(repo, base)
    patch_dir.mkdir(parents=True, exist_ok=True)
    for old in patch_files(patch_dir):
        old.unlink()
    for name, data in files.items():
        (patch_dir / name).write_bytes(data)
    return f"{repo.name}: exported {count(files)} from {base}..HEAD to {patch_dir}"


def next_step(repo: Path, version: str, patch_dir: Path) -> str:
    """What makes ``repo`` carry exactly ``patch_dir`` on ``base/<version>``, as a hint that works in its state.

    ``run `make export``` when HEAD holds commits of the user's that export can write, ``run `make apply``` when
    apply can check out or apply the series, else the reason apply would refuse (which says what to do).
    """
    if not (repo / ".git").is_dir():
        return "run `make apply` first"
    with contextlib.suppress(KitError):
        check_export(repo, version)
        if not kit_made(repo, rev(repo)):
            return "run `make export` (your commits become the series) or `make apply` (after DISCARD=1)"
    try:
        check_apply(repo, version, patch_dir)
    except KitError as e:
        return str(e)
    return "run `make apply` first"


def version_of(repo: Path, tip: str = "HEAD") -> str:
    """The version whose base ``tip`` stands on ('' when it is on none of the ``base/*`` tags)."""
    merged = git(repo, "for-each-ref", "--merged", tip, "--format=%(refname:short)", "refs/tags/base/").stdout
    return merged.split()[0].removeprefix("base/") if merged.split() else ""


def describe(repo: Path, patch_dir: Path) -> str:
    """One phrase: which version a checkout holds, on which branch, and whether it carries the series.

    E.g. ``deepspeed 0.19.8 on series/0.19.8: series applied (2 patches)``, ``accelerate 1.15.0 detached at
    base/1.15.0: series not applied``; plus ``, 2 uncommitted changes`` or ``, git am in progress``.
    """
    if not (repo / ".git").exists():  # a directory in a checkout, a file in a `git worktree`
        return f"{repo.name}: no checkout (run `make apply`)"
    version = version_of(repo)
    if not version:
        return f"{repo.name}: HEAD {rev(repo)[:12]} is on no base/<version>"
    base, on = f"base/{version}", current_branch(repo)
    where = f"on {on}" if on else (f"detached at {base}" if rev(repo) == rev(repo, base) else
                                   f"detached at {rev(repo)[:12]}")
    above = len(git(repo, "rev-list", f"{base}..HEAD").stdout.split())
    if matches(repo, base, patch_dir):
        state = f"series applied ({count(patch_files(patch_dir))})" if above else "series not applied"
    elif above and not kit_made(repo, rev(repo)):
        state = f"{plural(above, 'commit')} above the base that {patch_dir.name} patches do not hold (`make export`)"
    else:
        state = "series not applied" if not above else "another series applied"
    dirty = uncommitted(repo)
    extras = [plural(len(dirty), "uncommitted change")] if dirty else []
    git_dir = Path(repo, git(repo, "rev-parse", "--git-dir").stdout.strip())
    extras += [f"{doing} in progress" for name, doing in IN_PROGRESS.items() if (git_dir / name).exists()]
    return f"{repo.name} {version} {where}: {', '.join([state, *extras])}"
