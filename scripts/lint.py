"""Check each patch series as its upstream's reviewers would, and the kit's own code.

Per upstream (``[<name>.lint]`` of upstream/sources.toml): every ``commands`` entry is run from inside the
checkout (series applied) on the ``.py`` files the series adds or changes, with the program taken from the
tool environment ``--tools`` (``.tools/bin``, made by ``make tools`` from requirements/tools.txt); each such
file must start with the ``header`` regex and have no line that a ``forbidden`` rule's pattern matches; in a stack of
several commits, so must each commit below the top on its own (its pull request merges alone). Per patch:
it applies to the base with whitespace errors fatal (``git apply --cached --whitespace=error`` into a temporary
index), and its message has a subject of at most 72 characters, a body, a ``Fixes #N`` line and a
``Signed-off-by:`` trailer (DeepSpeed's DCO); all series are signed off by one identity. In a series of several
commits (``[[<name>.gate.commits]]``) each commit is checked so: ``Fixes #<key>`` for a numeric key, none needed for
a slug key (a follow-up without an issue number yet). The kit's own
code: ``ruff check`` with the kit's pyproject.toml, and the GitHub Actions workflows with actionlint. Prints one
line per problem; exit status 0 when clean.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from email.parser import BytesHeaderParser
from pathlib import Path

from scripts import KitError, plural, runlock, series, sources, stack, worktree
from scripts.git import git, rev

SUBJECT_MAX = 72
# The identity the kit's own series is signed with; whoever opens the pull request re-signs it as themselves.
PLACEHOLDER_SIGNOFF = "Signed-off-by: Contribution Kit <contribution-kit@users.noreply.github.com>"
# The line of a follow-up commit whose bug report is written (docs/issues/) but not filed upstream yet
FIXES_UNFILED = r"^Fixes #<.+>$"


def placeholder_notes(patch_dir: Path) -> list[str]:
    """Return a note for each patch of ``patch_dir`` still signed off by the kit's placeholder identity."""
    return [f"note: {p.name} is signed off by the kit's placeholder identity: run `make export RESIGN=1` to sign "
            f"it as yourself before you open the pull request" for p in series.patch_files(patch_dir)
            if PLACEHOLDER_SIGNOFF in p.read_text(errors="replace")]


def unfiled_issue_notes(patch_dir: Path) -> list[str]:
    """Return a note for each patch of ``patch_dir`` whose ``Fixes #<...>`` names a bug report not filed yet."""
    return [f"note: {p.name} says `Fixes #<...>`: file its bug report upstream (the kit's docs/issues/) and put "
            f"the issue's number there before you open the pull request" for p in series.patch_files(patch_dir)
            if re.search(FIXES_UNFILED, p.read_text(errors="replace"), re.M)]


def signoff_problems(patch_dirs: dict[str, Path]) -> list[str]:
    """One problem when the series of ``patch_dirs`` ({upstream: patches/<name>/}) are not all signed off by one
    identity: the kit's placeholder, or the contributor's after ``make export RESIGN=1``, which re-signs every series.
    """
    identities: dict[str, set[str]] = {}
    for name, patch_dir in patch_dirs.items():
        for patch in series.patch_files(patch_dir):
            for who in re.findall(r"^Signed-off-by: (.+)$", patch.read_text(errors="replace"), re.M):
                identities.setdefault(who.strip(), set()).add(name)
    if len(identities) <= 1:
        return []
    listed = "; ".join(f"{who} ({', '.join(sorted(names))})" for who, names in sorted(identities.items()))
    return [f"the series are signed off by {len(identities)} identities, {listed}: run `make export RESIGN=1` to sign "
            f"them all as yourself"]


def message_problems(patch: Path, key: str = "") -> list[str]:
    """Return what is missing from the commit message of the ``git format-patch`` file ``patch``.

    ``key``: the commit's key in a stack (``[[<name>.gate.commits]]``); a slug (a follow-up without an upstream issue
    number yet) needs no ``Fixes #N`` line, a number needs ``Fixes #<key>``.
    """
    text = patch.read_text(errors="replace")
    subject = BytesHeaderParser().parsebytes(patch.read_bytes()).get("Subject", "")
    subject = re.sub(r"\s+", " ", re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(subject))).strip()
    body = ("\n" + text.split("\n\n", 1)[1]).split("\n---\n", 1)[0] if "\n\n" in text else ""
    problems = []
    if len(subject) > SUBJECT_MAX:
        problems.append(f"subject is {len(subject)} characters (at most {SUBJECT_MAX})")
    prose = [line for line in body.splitlines() if line.strip() and not re.match(r"^[\w-]+: ", line)]
    if not prose:
        problems.append("commit message has no body")
    if key.isdigit() and not re.search(rf"^Fixes #{key}\b", body, re.M):
        problems.append(f"no `Fixes #{key}` line (its key in [[<name>.gate.commits]])")
    elif not key and not re.search(r"^Fixes #\d+", body, re.M):
        problems.append("no `Fixes #N` line")
    if not re.search(r"^Signed-off-by: .+ <[^>]+@[^>]+>$", body, re.M):
        problems.append("no `Signed-off-by: Name <email>` trailer (DCO)")
    return problems


def whitespace_problems(repo: Path, base: str, patches: list[Path]) -> dict[Path, str]:
    """Apply ``patches`` in order to ``base`` with whitespace errors fatal (series.first_failing).

    Returns {patch: git's first error line} for the first patch that fails (later ones are not tried).
    """
    failed = series.first_failing(repo, base, patches, "--whitespace=error")
    return {failed[0]: failed[1].splitlines()[0].replace(f"{failed[0]}:", "line ")} if failed else {}


def touched_python(repo: Path, base: str, commit: str = "HEAD") -> list[str]:
    """Return the ``.py`` files that ``base..commit`` adds or modifies (paths relative to ``repo``)."""
    out = git(repo, "diff", "--name-only", "--diff-filter=AM", base, commit, "--", "*.py").stdout
    return sorted(out.split())


def forbidden_problems(name: str, repo: Path, files: list[str], rules: list[dict]) -> list[str]:
    """One problem per line of ``files`` (relative to ``repo``) where a rule's ``pattern`` (a Python regex) matches,
    comments included, naming the rule's ``reason``: the ``forbidden`` list of ``[<name>.lint]`` in
    upstream/sources.toml."""
    problems = []
    for rule in rules:
        pattern = re.compile(rule["pattern"])
        for f in files:
            for number, line in enumerate((repo / f).read_text().splitlines(), 1):
                if pattern.search(line):
                    problems.append(f"{name}/{f}:{number}: {rule['reason']}")
    return problems


def require_series(pin: sources.Pin, repo: Path, patch_dir: Path) -> None:
    """Raise KitError unless ``repo`` carries exactly ``patch_dir``; its hint works in the checkout's state."""
    if not (repo / ".git").is_dir() or not series.matches(repo, f"base/{pin.version}", patch_dir):
        raise KitError(f"{repo} does not carry exactly {patch_dir}: "
                       f"{series.next_step(repo, pin.version, patch_dir)}")


def lint_upstream(pin: sources.Pin, table: dict, repo: Path, patch_dir: Path, tools: Path) -> list[str]:
    """Return the problems of one upstream's series; raise KitError when the series is not applied."""
    base = f"base/{pin.version}"
    require_series(pin, repo, patch_dir)
    patches = series.patch_files(patch_dir)
    launched = tuple(map(sources.launched_file, table.get("gate", {}).get("launch", [])))
    commits = stack.commits(pin.name, table.get("gate", {}), patches, (*pin.test_paths, *launched)) if patches else []
    keys = {c.patches[0]: c.key for c in commits if c.key}
    problems = [f"{p.relative_to(patch_dir.parent.parent)}: {m}" for p in patches
                for m in message_problems(p, keys.get(p, ""))]
    problems += [f"{p.relative_to(patch_dir.parent.parent)}: {m}"
                 for p, m in whitespace_problems(repo, base, patches).items()]
    lint = table.get("lint", {})
    problems += tree_problems(pin.name, lint, repo, touched_python(repo, base), tools)
    if len(patches) > 1:  # the pull requests merge one at a time: each commit below HEAD passes the checks alone
        problems += commit_problems(pin.name, lint, repo, base, patches, tools)
    return problems


def tree_problems(name: str, lint: dict, tree: Path, files: list[str], tools: Path) -> list[str]:
    """The problems of ``files`` (relative to ``tree``) by ``lint`` (``[<name>.lint]``): the license ``header``, the
    ``forbidden`` rules, and each of the ``commands`` run from inside ``tree`` with its program from ``tools/bin``.
    Raises KitError when a program is missing."""
    header = re.compile(lint.get("header", r"\A"))
    problems = [f"{name}/{f}: no license header" for f in files if not header.match((tree / f).read_text())]
    problems += forbidden_problems(name, tree, files, lint.get("forbidden", []))
    for command in lint.get("commands", []) if files else []:
        program = tools / "bin" / command[0]
        if not program.exists():
            raise KitError(f"{program} is missing: run `make tools` first")
        result = subprocess.run([str(program), *command[1:], *files], cwd=tree, capture_output=True, text=True)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            problems.append(f"{name}: `{' '.join(command)}` failed:\n{output}")
    return problems


def commit_problems(name: str, lint: dict, repo: Path, base: str, patches: list[Path], tools: Path) -> list[str]:
    """``tree_problems`` of each commit of a stack but the last (HEAD, checked in the checkout itself), in a
    throw-away tree of it (``scripts/worktree.py``), on the ``.py`` files ``base..<commit>`` adds or modifies; each
    problem is prefixed with the commit's patch file name."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="lint-") as scratch:
        tree = worktree.add(repo, Path(scratch) / name, base)
        for number, patch in enumerate(patches[:-1], 1):
            commit = f"HEAD~{len(patches) - number}"
            git(tree, "checkout", "--quiet", "--detach", rev(repo, commit), env=worktree.NO_HOOKS)
            problems += [f"{patch.name}: {problem}"
                         for problem in tree_problems(name, lint, tree, touched_python(repo, base, commit), tools)]
    return problems


def main(argv: list[str] | None = None) -> int:
    """Lint every upstream's series (or ``--only NAME``) and, unless ``--only``, the kit's code; 0 when clean."""
    parser = argparse.ArgumentParser(prog="python -m scripts.lint", description=__doc__.splitlines()[0])
    parser.add_argument("--only")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--tools", type=Path, default=sources.KIT_ROOT / ".tools")
    parser.add_argument("--ready", action="store_true",
                        help="only check that every checkout carries its series (before `make tools` runs)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return runlock.interruptible(lambda: run(args),
                                 lambda: runlock.describe_checkouts(args.checkouts, args.patches, args.sources))


def run(args: argparse.Namespace) -> int:
    """Check the checkouts, then lint; print one summary line per part with its problems under it; 0 when clean."""
    failed = False
    try:
        chosen = sources.versions(args.version)
        table = sources.load(args.sources)
        names = [args.only] if args.only else list(table)
        pins = {name: sources.pin(name, chosen.get(name), args.sources) for name in names}
        for name, pin in pins.items():
            require_series(pin, args.checkouts / name, args.patches / name)
        if args.ready:
            return 0
        for name, pin in pins.items():
            found = lint_upstream(pin, table[name], args.checkouts / name, args.patches / name, args.tools)
            report(f"lint {name} {pin.version}", found)
            for note in placeholder_notes(args.patches / name) + unfiled_issue_notes(args.patches / name):
                print(f"  {note}")
            failed |= bool(found)
        if not args.only:
            found = signoff_problems({name: args.patches / name for name in names}) + kit_problems(args.tools)
            report("lint kit", found)
            failed |= bool(found)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def report(what: str, problems: list[str]) -> None:
    """Print ``what: N problems`` and, under it, one indented line (or block) per problem."""
    print(f"{what}: {plural(len(problems), 'problem')}")
    for problem in problems:
        print(f"  {problem}")


def kit_problems(tools: Path) -> list[str]:
    """The kit's own code: ``ruff check`` of scripts/ and tests/, and the workflows with actionlint."""
    result = subprocess.run([str(tools / "bin" / "ruff"), "check", "--quiet", "scripts", "tests"],
                            cwd=sources.KIT_ROOT, capture_output=True, text=True)
    problems = [f"kit: `ruff check`:\n{result.stdout.strip()}"] if result.returncode else []
    workflows = sorted(str(p) for p in (sources.KIT_ROOT / ".github" / "workflows").glob("*.yml"))
    result = subprocess.run([str(tools / "bin" / "actionlint"), "-no-color", *workflows], capture_output=True,
                            text=True)
    return problems + ([f"kit: actionlint:\n{(result.stdout + result.stderr).strip()}"] if result.returncode else [])

if __name__ == "__main__":
    sys.exit(main())
