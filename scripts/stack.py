"""A series as a stack of commits: which commit each FAIL_TO_PASS test belongs to, and the gate's stage plan.

Data (upstream/sources.toml, README "The gate and its report"): a series of one commit keeps the flat
``[<name>.gate] fail_to_pass = [...]``; it is judged as one step, as one block, whatever number of patches it holds.
A series of several commits lists them in series order instead, one ``[[<name>.gate.commits]]`` table per patch
of ``patches/<name>/``: ``key``, the key of the kit's tests marked ``@pytest.mark.regression(<name>, key)`` that the
commit turns green (an upstream issue number, which must be the commit's ``Fixes #N``, or a slug string for a
follow-up without an issue number yet), and ``fail_to_pass``, the upstream node ids the commit adds and turns green.

Step k of a series of n: *before k* = the base + commits 1..k-1 + only commit k's test hunks, *after k* = the base
+ commits 1..k. After k and before k+1 hold the same code; they are one stage (one pytest run) when commit k+1's
test hunks only add files: after k's results are then that stage's without the files commit k+1 adds.
Everything here is pure (patch text and tables in, plans out), apart from reading the patch files.
"""

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from scripts import KitError

DIFF = re.compile(r"^diff --git a/(\S+) b/\S+\n(new file mode)?", re.M)


@dataclass
class Commit:
    """One step of a series: its number (1-based) of ``of``, its patch files (the whole series for a flat one),
    the regression key ('' for a flat series: every marked kit test of the upstream), the declared upstream node
    ids (without the ``upstream/<name>/`` prefix) and the patch's subject."""

    number: int
    of: int
    patches: list[Path]
    key: str
    fail_to_pass: list[str]
    subject: str

    @property
    def label(self) -> str:
        """``1/3`` for a commit of a stack, '' for a flat series."""
        return f"{self.number}/{self.of}" if self.key else ""


@dataclass(frozen=True)
class Stage:
    """One stage tree: the base + the first ``applied`` commits whole + only the test hunks of commit ``tests_of``
    (0: none)."""

    applied: int
    tests_of: int = 0


@dataclass
class Step:
    """Where step ``number`` finds its results: the indexes of its before and after stages in the plan, and the
    upstream test files to leave out of its after stage (added by the next commit, whose test hunks that stage
    also holds)."""

    number: int
    before: int
    after: int
    hidden: list[str] = field(default_factory=list)


def subject(patch: Path) -> str:
    """The commit subject of a ``git format-patch`` file, without its ``[PATCH n/m]`` prefix."""
    found = re.search(r"^Subject: (.*(?:\n .*)*)", patch.read_text(errors="replace"), re.M)
    text = re.sub(r"\s+", " ", found.group(1)) if found else patch.stem
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", text).strip()


def fixes(patch: Path) -> list[str]:
    """The issue numbers of the patch's ``Fixes #N`` lines."""
    return re.findall(r"^Fixes #(\d+)", patch.read_text(errors="replace"), re.M)


def series_id(patches: list[Path]) -> str:
    """A short id of what a series changes: sha256 of its patches' diffs (from the first ``diff --git``), so that
    re-signing or rewording a commit keeps it and any change to the code or tests makes another one; 12 hex digits."""
    digest = hashlib.sha256()
    for patch in patches:
        text = patch.read_text(errors="replace")
        digest.update(text[text.find("\ndiff --git "):].rsplit("\n-- \n", 1)[0].encode())
    return digest.hexdigest()[:12]


def changed_files(patch: Path, scope: tuple[str, ...] = ("",)) -> list[str]:
    """The files the patch changes under ``scope`` (path prefixes), in order."""
    return [m.group(1) for m in DIFF.finditer(patch.read_text(errors="replace")) if m.group(1).startswith(scope)]


def added_files(patch: Path) -> list[str]:
    """The files the patch adds (``new file mode``)."""
    return [m.group(1) for m in DIFF.finditer(patch.read_text(errors="replace")) if m.group(2)]


def added_tests(patches: list[Path]) -> dict[str, set[str]]:
    """{file: names of the ``test_*`` functions the patches add to it}, from their ``+`` lines."""
    added: dict[str, set[str]] = {}
    for patch in patches:
        file = ""
        for line in patch.read_text(errors="replace").splitlines():
            if line.startswith("+++ "):
                file = line[6:] if line.startswith("+++ b/") else ""
            found = re.match(r"^\+\s*def (test_\w+)\(", line)
            if found and file:
                added.setdefault(file, set()).add(found.group(1))
    return added


def adds(node_id: str, patches: list[Path], scope: tuple[str, ...]) -> bool:
    """True when ``patches`` add the upstream test ``node_id``: a ``def`` of its function (the name before any
    ``[params]``, or a prefix ``name_...`` of it, as parameterized.expand names tests) in its file, or, for an id
    that is a file (a launched script), a change to that file."""
    file, _, rest = node_id.partition("::")
    if not rest:
        return any(file in changed_files(p, scope) for p in patches)
    name = re.sub(r"\[.*\]$", "", rest.split("::")[-1])
    return any(name == d or name.startswith(d + "_") for d in added_tests(patches).get(file, ()))


def commits(name: str, gate: dict, patches: list[Path], scope: tuple[str, ...]) -> list[Commit]:
    """The steps of ``name``'s series from its ``[<name>.gate]`` table and its patch files.

    Flat ``fail_to_pass``: one step over every patch. ``commits`` tables: one step per patch. Raises KitError (one
    line) when the tables do not match the patches one to one, a numeric key is not the commit's ``Fixes #N``, two
    commits share a key, or a declared FAIL_TO_PASS id is not added by the commit that declares it.
    """
    tables = gate.get("commits")
    if tables is None:
        return [Commit(1, 1, patches, "", list(gate.get("fail_to_pass", [])),
                       subject(patches[0]) if len(patches) == 1 else f"{len(patches)} patches")]
    if "fail_to_pass" in gate:
        raise KitError(f"[{name}.gate] has both fail_to_pass and [[{name}.gate.commits]]: declare the ids per commit")
    if len(tables) != len(patches):
        more = (f"; a new commit needs a [[{name}.gate.commits]] table of its own in upstream/sources.toml (key, "
                f"fail_to_pass) and its PR body docs/pr/{name}/{len(patches)}.md (README, 'Changing a patch')"
                if len(patches) > len(tables) else "")
        raise KitError(f"[{name}.gate] lists {len(tables)} commits, patches/{name}/ holds {len(patches)}: one "
                       f"[[{name}.gate.commits]] table per patch, in series order{more}")
    made, keys = [], set()
    for number, (table, patch) in enumerate(zip(tables, patches, strict=True), 1):
        key = str(table.get("key", ""))
        where = f"[[{name}.gate.commits]] {number} (patches/{name}/{patch.name})"
        if not key or key in keys:
            raise KitError(f"{where}: give it a key of its own (its issue number or a slug)")
        if key.isdigit() and key not in fixes(patch):
            raise KitError(f"{where}: key {key} is not the commit's Fixes #N ({', '.join(fixes(patch)) or 'none'})")
        for node in table.get("fail_to_pass", []):
            if not adds(node, [patch], scope):
                raise KitError(f"{where}: FAIL_TO_PASS {node} is not a test this commit adds: declare it for the "
                               "commit that adds it")
        keys.add(key)
        made.append(Commit(number, len(tables), [patch], key, list(table.get("fail_to_pass", [])), subject(patch)))
    return made


def plan(steps: list[Commit], scope: tuple[str, ...]) -> tuple[list[Stage], list[Step]]:
    """The stages to run for ``steps`` and where each step reads its before and after results.

    A flat series: [before, after] = [Stage(0, 1), Stage(1)], as the gate always ran. A stack of n: before 1,
    then per commit k its after stage, shared with before k+1 when commit k+1's test hunks only add files under
    ``scope``; so n + 1 stages when every follow-up's tests are new files, 2n at most.
    """
    stages, found = [Stage(0, 1)], []
    for commit in steps:
        k = commit.number
        before = len(stages) - 1
        following = steps[k] if k < len(steps) else None
        new = following and set(changed_files(following.patches[0], scope)) <= set(added_files(following.patches[0]))
        if following and new:
            stages.append(Stage(k, k + 1))
            found.append(Step(k, before, len(stages) - 1, changed_files(following.patches[0], scope)))
            continue
        stages.append(Stage(k))
        found.append(Step(k, before, len(stages) - 1))
        if following:
            stages.append(Stage(k, k + 1))
    return stages, found
