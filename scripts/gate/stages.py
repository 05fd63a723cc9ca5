"""Running the gate's stages: the upstreams to gate, their stage plan, the stages' trees, one pytest process per stage
index, its progress lines, and the per-upstream records that grading.py judges (``graded``).

The package's docstring (scripts/gate/__init__.py) says what a stage holds and runs.
"""

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from scripts import (
    KitError,
    launch,
    plural,
    series,
    sources,
    stack,
    worktree,
)
from scripts import cache as reuse
from scripts.checkout import BASE_ENV
from scripts.gate import cache, grading
from scripts.git import git, rev

STAGE_TIMEOUT = 1800.0  # seconds of one stage's pytest process
LAUNCH_TIMEOUT = 300.0  # seconds of one launched upstream script
PROGRESS_S = 30.0  # seconds between two progress lines while the stages run (issue 22)
CHECKS = ("series", "fix")


@dataclass
class Upstream:
    """One upstream to gate: pin, checkout, series, its ``[<name>.gate]`` table (its commits, scripts/stack.py) and
    the release's declared check; the stage plan; then what preparing its stages found (trees by stage name, the
    commit of each tree, the stage whose run of the kit's suite each stage's results are read from, skipped files,
    problems)."""

    pin: sources.Pin
    repo: Path
    patch_dir: Path
    upstream_tests: list[str]
    launches: list[dict]
    commits: list
    check: str = "series"
    reason: str = ""
    not_run: dict = field(default_factory=dict)
    stages: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    names: list = field(default_factory=list)
    trees: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)
    tree_ids: dict = field(default_factory=dict)
    kit_stages: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    @property
    def fail_to_pass(self) -> list[str]:
        """Every declared upstream FAIL_TO_PASS id, any commit."""
        return [key for commit in self.commits for key in commit.fail_to_pass]

    @property
    def package(self) -> str:
        """The import name of the upstream's package (``accelerate``)."""
        return self.pin.package.replace("-", "_")

    def test_scope(self) -> tuple[str, ...]:
        """What counts as test code of the series: the ``test_paths`` and the launched files."""
        return (*self.pin.test_paths, *map(sources.launched_file, self.launches))

    def package_dir(self, stage: str) -> Path:
        """The directory of the stage's tree that holds the importable package (``src/`` or the tree itself)."""
        return worktree.package_dir(self.trees[stage], self.package)


def load_upstreams(args: argparse.Namespace) -> list[Upstream]:
    """The selected upstreams from the pins file; raise KitError when one is unknown, has no checkout or base, or
    declares an unknown check."""
    table = sources.load(args.sources)
    names = [args.only] if args.only else list(table)
    chosen = sources.versions(args.version)
    ups = []
    for name in names:
        pin = sources.pin(name, chosen.get(name), args.sources)
        repo = args.checkouts / name
        if not (repo / ".git").exists():
            raise KitError(f"{repo} does not exist: run `make apply` first")
        series.require_base(repo, pin.version)
        gate = table[name].get("gate", {})
        release = table[name]["releases"][pin.version]
        check = release.get("check", "series")
        if check not in CHECKS:
            raise KitError(f"[{name}.releases.\"{pin.version}\"] check = {check!r}: use one of {', '.join(CHECKS)}")
        launches = list(gate.get("launch", []))
        scope = (*pin.test_paths, *map(sources.launched_file, launches))
        patches = series.patch_files(args.patches / name)
        commits = stack.commits(name, gate, patches, scope) if patches else []
        if check == "fix" and len(commits) > 1:
            raise KitError(f"[{name}.releases.\"{pin.version}\"] check = \"fix\" is for a series of one commit; "
                           f"{name}'s has {len(commits)}")
        not_run = gate.get("not_run", {})
        if not isinstance(not_run, dict) or not all(isinstance(why, str) and why for why in not_run.values()):
            raise KitError(f"[{name}.gate] not_run must be a table of upstream test ids and one-line reasons, e.g. "
                           '{ "tests/test_x.py::Class::test" = "needs a GPU" }')
        up = Upstream(pin, repo, args.patches / name, list(gate.get("upstream_tests", [])), launches, commits, check,
                      release.get("reason", ""), dict(not_run))
        if commits:
            up.stages, up.steps = stack.plan(commits, scope)
        else:
            up.stages, up.steps = [stack.Stage(0, 1), stack.Stage(1)], [stack.Step(1, 0, 1)]
        ups.append(up)
    name_stages(ups)
    for up in ups:
        refuse_unstacked_tests(up)
    return ups


def name_stages(ups: list[Upstream]) -> None:
    """Give the i-th stage of every upstream the same name (they run in one pytest process): ``before`` and
    ``after`` when every series is one step, as always, else ``stage-0``, ``stage-1``, ..."""
    count = max(len(up.stages) for up in ups) if ups else 0
    names = ["before", "after"] if count == 2 else [f"stage-{i}" for i in range(count)]
    for up in ups:
        up.names = names[:len(up.stages)]


def refuse_unstacked_tests(up: Upstream) -> None:
    """Raise KitError when a commit's test hunks do not apply to the base + the commits before it (a stack's
    before stages need them so); checked in a temporary index before anything is written."""
    if len(up.commits) < 2:
        return
    base = rev(up.repo, f"base/{up.pin.version}")
    for commit in up.commits:
        tests = test_files(commit.patches, up.test_scope())
        earlier = [p for c in up.commits[:commit.number - 1] for p in c.patches]
        failed = tests and hunks_fail(up.repo, base, earlier, commit.patches, [f"--include={t}" for t in tests])
        if failed:
            raise KitError(f"patches/{up.pin.name}/{commit.patches[0].name}: its test hunks do not apply to the base "
                           f"+ the commits before it ({failed}): move them to the commit that makes their context")


def hunks_fail(repo: Path, base: str, earlier: list[Path], patches: list[Path], options: list[str]) -> str:
    """Apply ``earlier`` whole (``--3way``, as ``git am --3way``) and then ``patches`` with ``options`` to ``base``
    in a temporary index (the checkout is not touched); git's first error line for ``patches``, '' when they apply or
    when ``earlier`` does not (the series itself does not apply: prepare reports where)."""
    with tempfile.TemporaryDirectory(prefix="kit-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", base, env=env)
        for patch in earlier:
            if git(repo, "apply", "--cached", "--3way", str(patch), env=env, check=False).returncode != 0:
                return ""
        for patch in patches:
            result = git(repo, "apply", "--cached", *options, str(patch), env=env, check=False)
            if result.returncode != 0 and "No valid patches in input" not in result.stderr:
                return (result.stderr.strip().splitlines() or ["does not apply"])[0]
    return ""


# ---------------------------------------------------------------------------------------------------------------
# The stages' trees.


def commit_all(tree: Path, message: str) -> None:
    """Commit whatever the index of ``tree`` holds (if anything), with the fixed identity and date of the bases."""
    if git(tree, "diff", "--cached", "--quiet", check=False).returncode != 0:
        git(tree, "commit", "--quiet", "--no-verify", "--message", message, env={**BASE_ENV, **worktree.NO_HOOKS})


def apply_hunks(tree: Path, patches: list[Path], options: list[str]) -> str:
    """``git apply --index OPTIONS`` every patch in ``tree`` in order; return git's first error line ('' if all did).

    A patch none of whose files ``options`` selects is skipped (``git apply`` would refuse an empty patch).
    """
    for patch in patches:
        result = git(tree, "apply", "--index", "--check", *options, str(patch), check=False)
        if result.returncode == 0:
            git(tree, "apply", "--index", *options, str(patch))
        elif "No valid patches in input" not in result.stderr:
            return f"patches/{patch.parent.name}/{patch.name}: {(result.stderr.strip().splitlines() or ['?'])[0]}"
    return ""


def test_files(patches: list[Path], scope: tuple[str, ...]) -> list[str]:
    """The files under ``scope`` (paths or directory prefixes) that the series changes, in order of appearance."""
    found = []
    for patch in patches:
        for name in re.findall(r"^diff --git a/(\S+) b/", patch.read_text(errors="replace"), re.M):
            if name.startswith(scope) and name not in found:
                found.append(name)
    return found


def prepare(up: Upstream, root: Path) -> None:
    """Make the trees of ``up``'s stages under ``root/<stage>/<name>``; record their commits, skipped test files and
    problems (a series or fix that does not apply) in ``up``. Raises KitError when git fails otherwise."""
    base = rev(up.repo, f"base/{up.pin.version}")
    for name in up.names:
        up.trees[name] = worktree.add(up.repo, root / name / up.pin.name, base)
    if up.check == "fix":  # a series of one commit (load_upstreams): its before and after
        patches = series.patch_files(up.patch_dir)
        tests = test_files(patches, up.test_scope())
        before, after = (up.trees[name] for name in up.names)
        applying = [name for name in tests
                    if series.first_failing(up.repo, base, patches, f"--include={name}") is None]
        up.skipped = [name for name in tests if name not in applying]
        if applying:
            apply_hunks(before, patches, [f"--include={name}" for name in applying])
        commit_all(before, "gate: the series' test files that apply")
        failed = apply_hunks(after, patches, [f"--exclude={name}" for name in up.skipped])
        if failed:
            up.problems.append(f"{up.pin.name}: the series' fix hunks do not apply to {up.pin.version}: {failed}")
        commit_all(after, "gate: the series' fix hunks and the test files that apply")
    else:
        for stage, name in zip(up.stages, up.names, strict=True):
            tree = up.trees[name]
            failed = worktree.apply_series(tree, [p for c in up.commits[:stage.applied] for p in c.patches])
            problem = (f"{up.pin.name}: the series does not apply to {up.pin.version} ({failed}); a release can "
                       "declare check = \"fix\" in upstream/sources.toml")
            if failed and problem not in up.problems:
                up.problems.append(problem)
            if stage.tests_of and up.commits:
                commit = up.commits[stage.tests_of - 1]
                tests = test_files(commit.patches, up.test_scope())
                failed = apply_hunks(tree, commit.patches, [f"--include={name}" for name in tests]) if tests else ""
                if failed:
                    up.problems.append(f"{up.pin.name}: the series' test hunks do not apply to {up.pin.version}: "
                                       f"{failed}")
                commit_all(tree, "gate: the test hunks of the series" if len(up.commits) == 1 else
                           f"gate: the test hunks of commit {commit.number}")
    up.heads = {name: rev(up.trees[name]) for name in up.names}
    # The stage trees are clones that are deleted afterwards: their commits do not reach the checkout, their tree ids
    # are what make pr compares with the checkout's HEAD
    up.tree_ids = {name: git(up.trees[name], "rev-parse", "HEAD^{tree}").stdout.strip() for name in up.names}
    up.kit_stages = kit_stages({name: code_id(up.trees[name], up.test_scope()) for name in up.names})


def code_id(tree: Path, scope: tuple[str, ...]) -> str:
    """What the kit's suite of an upstream can see of a stage tree: sha1 of ``git ls-tree -r -z HEAD`` (mode, blob id
    and path of each file) without the files under ``scope``, the upstream's test paths and launched scripts, which
    the kit's suites never import. (The other upstream's tree, also on the stage's PYTHONPATH, is not part of it:
    neither kit suite imports the other upstream, as the stages' import records show.)"""
    listing = git(tree, "ls-tree", "-r", "-z", "--full-tree", "HEAD").stdout.split("\0")
    code = "\0".join(entry for entry in listing if entry and not entry.split("\t", 1)[1].startswith(scope))
    return hashlib.sha1(code.encode()).hexdigest()


def kit_stages(code: dict[str, str]) -> dict[str, str]:
    """{stage: the first stage, in order, with the same code id (``code_id``)}: the stage that runs the upstream's
    kit suite for it. After commit k and before commit k+1 of a stack hold the same code when commit k+1 edits test
    files that exist (two stages, scripts/stack.plan); the kit's suite, whose results depend on that code only, then
    runs once for both (issue 31: 3 of the 8 runs of the Accelerate suite, about 150 s of the gate's CPU)."""
    first: dict[str, str] = {}
    return {stage: first.setdefault(digest, stage) for stage, digest in code.items()}


# ---------------------------------------------------------------------------------------------------------------
# The stages' runs.


def stage_env(ups: list[Upstream], stage: str, stage_dir: Path) -> dict:
    """The environment of a stage's pytest: the trees first on PYTHONPATH, then the kit; one OpenMP thread; its own
    TMPDIR; the import record of scripts/launch_site/sitecustomize.py. Bytecode is written even where
    ``PYTHONDONTWRITEBYTECODE`` is set: the trees are new, and each of the stage's processes (the ranks and
    forkservers of its launches) would otherwise compile the upstream anew."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join([*(str(up.package_dir(stage)) for up in ups), str(sources.KIT_ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    env["TMPDIR"] = str(stage_dir / "tmp")
    env["KIT_IMPORT_RECORD"] = str(stage_dir / "imports")
    env["KIT_IMPORT_PACKAGES"] = ",".join(up.package for up in ups)
    return env


def stage_command(ups: list[Upstream], stage: str, stage_dir: Path, root: Path, suites: Path) -> list[str]:
    """The pytest command line of one stage: every upstream's kit suite, upstream tests and launched scripts (those
    in the stage's tree: a stack's later commits add some). A kit suite that an earlier stage runs on the same code
    (``kit_stages``) is collected and deselected (``--deselect``): the stage's process loads its conftest.py and
    imports its modules as the others do, and runs none of its tests.

    Without pytest's ``unraisableexception`` plugin, whose last act is a full garbage collection: on a base (the
    before stages), tests that fail keep DataLoader iterators alive in reference cycles, and collected then, each
    waits torch's 5 s for every worker before it kills it (about 30 s of a stage). Such an exception only ever makes
    a warning, which the gate does not judge. Without anyio's plugin, as the kit's pyproject.toml says (the stages of
    the kit's own tests run outside the kit's root)."""
    paths, launches, deselect = [], [], []
    for up in ups:
        paths.append(str(suites / up.pin.name))
        if up.kit_stages.get(stage, stage) != stage:
            deselect.append(f"--deselect={os.path.relpath(suites / up.pin.name, root)}/")
        tests, entries = stage_tests(up, stage)
        deselect += [f"--deselect={os.path.relpath(up.trees[stage], root)}/{test}" for test in up.not_run]
        paths += [str(up.trees[stage] / test) for test in tests]
        launches += ["--launch=" + json.dumps(in_tree(entry, up.trees[stage])) for entry in entries]
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:unraisableexception", "-p", "no:anyio",
            "-o", "junit_family=xunit1",
            f"--junitxml={stage_dir / 'junit.xml'}", f"--basetemp={stage_dir / 'tmp' / 'pytest'}", "-q", "-rfEs",
            "-p", "scripts.pytest_regression", "-p", "scripts.pytest_launch", f"--launch-logs={stage_dir / 'launch'}",
            "-p", "scripts.pytest_progress", f"--progress-file={stage_dir / 'progress'}",
            f"--progress-expect={stage_dir / 'expected.json'}",
            f"--launch-timeout={LAUNCH_TIMEOUT}", f"--rootdir={root}", *deselect, *launches, *paths]


def stage_tests(up: Upstream, stage: str) -> tuple[list[str], list[dict]]:
    """(the upstream test files, the ``launch`` entries) that ``up``'s ``stage`` runs: those its tree holds (a
    stack's later commits add some), less the skipped files of a ``check = "fix"`` release."""
    tree = up.trees[stage]
    return ([test for test in up.upstream_tests if test not in up.skipped and (tree / test).exists()],
            [entry for entry in up.launches
             if sources.launched_file(entry) not in up.skipped and sources.launched_in(entry, tree)])


def in_tree(entry: dict, tree: Path) -> dict:
    """A ``launch`` entry for scripts/pytest_launch.py: its path made absolute in ``tree``; a script's ``nproc``
    defaults to 2."""
    if "pytest" in entry:
        return {**entry, "pytest": str(tree / entry["pytest"])}
    return {**entry, "script": str(tree / entry["script"]), "nproc": entry.get("nproc", 2)}


def renamer(ups: list[Upstream], stage: str, root: Path):
    """A function that turns a stage's node id of an upstream test (a path in the stage's tree) into the report's
    ``upstream/<name>/<path in the tree>``; other ids are returned unchanged."""
    trees = [(up.trees[stage].resolve(), f"upstream/{up.pin.name}/") for up in ups]

    def rename(key: str) -> str:
        file, sep, rest = key.partition("::")
        path = (root / file).resolve()
        for tree, prefix in trees:
            if path.is_relative_to(tree):
                return f"{prefix}{path.relative_to(tree).as_posix()}{sep}{rest}"
        return key

    return rename


def check_imports(up: Upstream, stage: str, records: list[dict]) -> dict:
    """Where the stage's processes imported ``up``'s package from: {"processes", "modules", "outside"}.

    ``records`` are the sitecustomize records of the stage. ``outside`` lists the module files outside the stage's
    tree (each a violation); a stage where no process imported the package is a violation too.
    """
    tree, processes, files = up.trees[stage].resolve(), 0, set()
    for record in records:
        found = {f for name, f in record["modules"].items() if f and name.partition(".")[0] == up.package}
        processes += bool(found)
        files |= found
    # Every process imports much the same modules: each file is resolved once (the judging took 150 s without it).
    outside = {file for file in files if not Path(file).resolve().is_relative_to(tree)}
    modules = files - outside
    if outside:
        up.problems.append(f"{up.pin.name} {stage}: {len(outside)} modules imported from outside the stage's tree, "
                           f"e.g. {sorted(outside)[0]}")
    elif not processes:
        up.problems.append(f"{up.pin.name} {stage}: no process of the stage imported `{up.package}`")
    return {"processes": processes, "modules": len(modules), "outside": sorted(outside)}


def read_records(directory: Path) -> list[dict]:
    """The import records (``<pid>.json``) in ``directory``; unreadable ones are skipped."""
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def collect_stacks(stage_dir: Path, out: Path) -> list[str]:
    """Copy every log under ``stage_dir`` that holds stack dumps (a launch that timed out) to ``out/stacks/``;
    return their paths relative to ``out``."""
    found = []
    for log in sorted(stage_dir.rglob("*.log")):
        if "--- kit: stacks of pid" in log.read_text(errors="replace"):
            target = out / "stacks" / f"{stage_dir.name}-{'-'.join(log.relative_to(stage_dir).parts)}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, target)
            found.append(target.relative_to(out).as_posix())
    return found


def stage_names(ups: list[Upstream]) -> list[str]:
    """The names of the stages to run, in order: every upstream's i-th stage runs in the i-th (name_stages)."""
    return max((up.names for up in ups), key=len, default=[])


def stage_roles(ups: list[Upstream]) -> dict[str, str]:
    """{stage name: what the stage is to each upstream's steps}, e.g. ``after deepspeed 1/3, before deepspeed 2/3,
    after accelerate`` (a series of one commit: ``before accelerate``)."""
    roles: dict[str, list[str]] = {}
    for up in ups:
        for step in up.steps:
            label = f"{up.pin.name} {step.number}/{len(up.steps)}" if len(up.commits) > 1 else up.pin.name
            roles.setdefault(up.names[step.before], []).append(f"before {label}")
            roles.setdefault(up.names[step.after], []).append(f"after {label}")
    return {stage: ", ".join(found) for stage, found in roles.items()}


def expected_failures(ups: list[Upstream], stage: str, root: Path) -> dict:
    """The tests of ``stage`` whose failures are expected, for scripts/pytest_progress.py's ``--progress-expect``:
    {"markers": the kit's tests of every commit the stage does not hold yet (``<name>#<key>``, ``<name>#*`` for a
    series judged as one step), "ids": the declared upstream FAIL_TO_PASS tests whose test hunks it holds without
    their commit (pytest's node ids: paths in the stage's tree relative to ``root``)}."""
    markers, ids = [], []
    for up in ups:
        if stage not in up.names:
            continue
        held = up.stages[up.names.index(stage)]
        if len(up.commits) > 1:
            markers += [f"{up.pin.name}#{c.key}" for c in up.commits if c.number > held.applied]
        elif not held.applied:
            markers.append(f"{up.pin.name}#*")
        if up.commits and held.tests_of > held.applied:
            tree = up.trees[stage].resolve()
            for key in up.commits[held.tests_of - 1].fail_to_pass:
                file, sep, rest = key.partition("::")
                ids.append(f"{(tree / file).relative_to(root).as_posix()}{sep}{rest}")
    return {"markers": markers, "ids": ids}


def expectation(failed: int, expected: int) -> str:
    """Whether a stage's ``failed`` failures are the expected ones (``expected`` of them are)."""
    if failed == expected:
        return "all expected"
    return f"{plural(failed - expected, 'failure')} NOT expected: see the log"


def failures_text(failed: int, expected: int) -> str:
    """How many tests of a stage failed so far, and whether they are the expected ones."""
    return f"{failed} failed ({expectation(failed, expected)})" if failed else "none failed"


def stage_summary(stage_dir: Path, outcomes: Counter) -> str:
    """The outcomes of a stage that ended (``3 failed, 12 passed``), with whether its failures were expected."""
    text = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "no tests"
    with contextlib.suppress(OSError, ValueError, KeyError):
        counts = json.loads((stage_dir / "progress").read_text())
        if counts["failed"]:
            text += f" ({expectation(counts['failed'], counts['expected'])})"
    return text


def stage_progress(job: launch.Job, role: str, rename) -> str:
    """``<stage> (<role>): D/T tests done, F failed ...`` from the stage's ``--progress-file``
    (scripts/pytest_progress.py), with the test it has been running for PROGRESS_S or more; or how far it got
    before its tests ran (waiting, collecting). ``rename``: the report's name of a node id (``renamer``)."""
    stage = job.log.parent.name
    head = f"{stage} ({role}):" if role and stage not in grading.STAGES else f"{stage}:"
    if not job.started:
        return f"{head} waiting"
    try:
        counts = json.loads((job.log.parent / "progress").read_text())
    except (OSError, ValueError):
        return f"{head} collecting"
    failed = failures_text(counts["failed"], counts["expected"])
    if (job.log.parent / "junit.xml").exists():  # pytest writes it as the session ends
        return f"{head} finished: {counts['done']} tests, {failed}"
    text = f"{head} {counts['done']}/{counts['total']} tests done, {failed}"
    running = counts.get("running")
    if running and time.time() - running[1] >= PROGRESS_S:
        text += f", running {rename(running[0])} for {time.time() - running[1]:.0f} s"
    return text


@contextlib.contextmanager
def progress_lines(describe, every: float):
    """While the block runs, print every ``every`` seconds the elapsed time and ``describe()``'s lines (the first on
    the same line, the others indented below it)."""
    stop, started = threading.Event(), time.monotonic()

    def tick():
        while not stop.wait(every):
            first, *others = describe()
            print("\n".join([f"gate: {time.monotonic() - started:.0f} s: {first}", *(f"  {x}" for x in others)]),
                  flush=True)

    thread = threading.Thread(target=tick, name="gate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def stage_inputs(up: Upstream, stage: str, args: argparse.Namespace, shared: dict) -> dict:
    """What the ``stage`` of ``up`` runs, as cache.py keys it: ``shared`` (the environment and the gate's code, the
    same for every stage of a run), the stage's tree id and path, the kit's suite and whether the stage runs it, the
    upstream tests and launch entries it runs (those its tree holds)."""
    tests, entries = stage_tests(up, stage)
    return {**shared, "upstream": up.pin.name, "tree": up.tree_ids[stage], "path": str(up.trees[stage]),
            "suite": cache.suite_digest(args.suites.resolve(), up.pin.name),
            "kit_suite": "runs" if up.kit_stages.get(stage, stage) == stage else "read from an earlier stage",
            "upstream_tests": tests, "launches": entries, "not_run": sorted(up.not_run),
            "timeouts": [args.timeout, LAUNCH_TIMEOUT]}


def reusable(up: Upstream, stage: str, args: argparse.Namespace, shared: dict) -> tuple[str, dict | None]:
    """(the key of ``up``'s ``stage``, its stored entry or None: the stage runs). With ``args.cache`` off, no entry
    is read."""
    stage_key = reuse.key(stage_inputs(up, stage, args, shared))
    return stage_key, cache.load(args.cache_dir, stage_key) if args.cache else None


def run_stages(ups: list[Upstream], args: argparse.Namespace, run_id: str) -> dict[str, dict[str, dict]]:
    """Run the stages side by side (at most ``args.jobs`` at once), each over the upstreams that have it and whose
    stored results (cache.py) cannot be reused; return {upstream: {stage: {"launch", "results", "records",
    "reused", "key", "log"}}} with the JUnit results renamed for the report (``reused``: the id of the run that made
    a reused result, '' for a stage run now, whose results are stored under ``run_id``). A stage that times out is
    killed after its stacks are written to its log, and recorded as a problem of its upstreams. Raises KitError when
    a stage that ended wrote no JUnit XML."""
    root = args.suites.resolve().parent
    shared = {"environment": reuse.environment_inputs(), "gate": cache.gate_code_digest()}
    done: dict[str, dict[str, dict]] = {up.pin.name: {} for up in ups}
    keys = {}
    for up in ups:
        for stage in up.names:
            keys[up.pin.name, stage], entry = reusable(up, stage, args, shared)
            if entry:
                done[up.pin.name][stage] = {**entry, "reused": entry["run"], "key": keys[up.pin.name, stage],
                                            "launch": launch.Launch(**entry["launch"], log=entry["log"])}
    jobs, stages, roles = [], [], stage_roles(ups)
    for stage in stage_names(ups):
        mine = [up for up in ups if stage in up.trees and stage not in done[up.pin.name]]
        reused = [f"{up.pin.name} reused (run {done[up.pin.name][stage]['reused']})" for up in ups
                  if stage in done[up.pin.name]]
        if reused:
            print(f"gate {stage}: {', '.join(reused)}", flush=True)
        if not mine:
            continue
        stage_dir = (args.out / stage).resolve()
        (stage_dir / "tmp").mkdir(parents=True)
        (stage_dir / "imports").mkdir()
        (stage_dir / "expected.json").write_text(json.dumps(expected_failures(mine, stage, root)))
        command = stage_command(mine, stage, stage_dir, root, args.suites.resolve())
        stages.append((stage, mine))
        jobs.append(launch.Job(command, stage_dir / "pytest.log", args.timeout, cwd=sources.KIT_ROOT,
                               env=stage_env(mine, stage, stage_dir)))
    if not jobs:
        print("gate: every stage's results are reused (GATE_CACHE=0 runs them all)", flush=True)
        return done
    print(f"gate: stages {', '.join(stage for stage, _ in stages)} started (at most {args.jobs} at once; logs in "
          f"{os.path.relpath(args.out)}/<stage>/pytest.log)", flush=True)
    for stage, _ in stages:
        if stage not in grading.STAGES:
            print(f"  {stage}: {roles.get(stage, '')}", flush=True)
    print("  (a stage before a commit fails that commit's FAIL_TO_PASS tests on purpose: the progress says whether "
          "its failures are those)", flush=True)
    renames = {stage: renamer(mine, stage, root) for stage, mine in stages}

    def describe() -> list[str]:
        return ["the stages' tests done / collected", *(stage_progress(job, roles.get(stage, ""), renames[stage])
                                                        for (stage, _), job in zip(stages, jobs, strict=True))]

    with progress_lines(describe, PROGRESS_S):
        launches = launch.run_all(jobs, args.jobs)
    for (stage, mine), job, result in zip(stages, jobs, launches, strict=True):
        stage_dir, results = job.log.parent, {}
        if result.timed_out:  # every test of the stage is then missing: violations, and the report says why
            for up in mine:
                up.problems.append(f"{up.pin.name}: the {stage} stage timed out after {args.timeout:.0f} s and was "
                                   f"killed; the stacks of its processes are in stacks/{stage}-pytest.log")
        else:
            results = grading.read_junit(stage_dir / "junit.xml", renamer(mine, stage, root))
        records = read_records(stage_dir / "imports")
        for up in mine:
            done[up.pin.name][stage] = {"launch": result, "results": results, "records": records, "reused": "",
                                        "key": keys[up.pin.name, stage], "log": job.log}
        outcomes = Counter(r.outcome for r in results.values())
        print(f"gate {stage}: {stage_summary(stage_dir, outcomes)} in {result.seconds} s, {result.cpu_s} s of CPU "
              f"(log: {os.path.relpath(job.log)})", flush=True)
        if storable(stage_dir, result):
            for up in mine:
                store(up, done[up.pin.name][stage], args, run_id)
    return done


def storable(stage_dir: Path, result: launch.Launch) -> bool:
    """Whether a stage that ran may be stored for reuse: pytest ended (exit 0, or 1 for failed tests) within its
    timeout, and its failures were all the expected ones (its ``--progress-file``); else it runs again next time."""
    try:
        counts = json.loads((stage_dir / "progress").read_text())
    except (OSError, ValueError):
        return False
    return result.returncode in (0, 1) and counts.get("failed") == counts.get("expected")


def prefixes(up: Upstream, root: Path, suites: Path) -> tuple[str, str]:
    """(the report's prefix of ``up``'s kit tests, e.g. ``tests/deepspeed/``, that of its upstream tests,
    ``upstream/deepspeed/``): a stage's results of ``up`` are the tests whose ids start with one of them."""
    return f"{os.path.relpath(suites / up.pin.name, root)}/", f"upstream/{up.pin.name}/"


def store(up: Upstream, ran: dict, args: argparse.Namespace, run_id: str) -> None:
    """Store what ``up``'s stage ``ran`` (an entry of run_stages) under its key in the cache: its own results (its
    kit suite and upstream tests), the import records and the launch's figures. A disk that refuses costs the reuse,
    with one line, not the run."""
    own = prefixes(up, args.suites.resolve().parent, args.suites.resolve())
    launched = ran["launch"]
    entry = {"run": run_id, "upstream": up.pin.name, "records": ran["records"],
             "results": {test: r for test, r in ran["results"].items() if test.startswith(own)},
             "launch": {"returncode": launched.returncode, "seconds": launched.seconds, "cpu_s": launched.cpu_s}}
    try:
        cache.store(args.cache_dir, ran["key"], entry, launched.log)
    except OSError as e:
        print(f"gate: could not keep the results of {up.pin.name}'s stage for reuse ({e}); it runs again next time",
              flush=True)


def seconds(results) -> float:
    """The sum of the JUnit durations of ``results`` (s), rounded to 0.1."""
    return round(sum(r.seconds for r in results), 1)


def holds(up: Upstream, stage: stack.Stage) -> str:
    """What a stage tree of ``up`` holds, in the report's words."""
    if up.check == "fix":
        return "the base + the series' test files that apply" + (" + its fix hunks" if stage.applied else "")
    if len(up.commits) <= 1:
        return "the base + the series" if stage.applied else "the base + only the series' test hunks"
    text = f"the base + commits 1..{stage.applied}" if stage.applied else "the base"
    return text + (f" + the test hunks of commit {stage.tests_of}" if stage.tests_of else "")


def graded(up: Upstream, done: dict, root: Path, suites: Path, out: Path) -> grading.Upstream:
    """The grading record of ``up`` from ``done``, its stages' entries of ``run_stages``: each step's results of its
    before and after stages, declared ids, imports, times, and per stage whether it ran or was reused (from which run,
    under which key), with its log and results (``out/<stage>/`` when it ran, the cache entry when reused)."""
    kit_prefix, upstream_prefix = prefixes(up, root, suites)
    g = grading.Upstream(up.pin.name, up.pin.version, rev(up.repo, f"base/{up.pin.version}"), check=up.check,
                         reason=up.reason, skipped=up.skipped, upstream_tests=bool(up.upstream_tests or up.launches),
                         series_id=stack.series_id(series.patch_files(up.patch_dir)), not_run=up.not_run)
    stacked = len(up.commits) > 1
    g.keys = {commit.key for commit in up.commits} if stacked else set()
    results, shared = {}, []
    for stage, name in zip(up.stages, up.names, strict=True):
        if name not in done:
            continue
        g.stages[name] = {"commit": up.heads.get(name, ""), "tree": up.tree_ids.get(name, ""),
                          "holds": holds(up, stage)}
        kit_stage = up.kit_stages.get(name, name)
        mine = {k: r for k, r in done[name]["results"].items() if k.startswith(upstream_prefix)}
        kit = {k: r for k, r in done.get(kit_stage, {}).get("results", {}).items() if k.startswith(kit_prefix)}
        results[name] = {**kit, **mine}
        g.imports[name] = check_imports(up, name, done[name]["records"])
        g.stages[name] |= {"wall_s": done[name]["launch"].seconds, "cpu_s": done[name]["launch"].cpu_s,
                           "upstream_tests_s": seconds(mine.values()), "reused": done[name]["reused"],
                           "key": done[name]["key"][:12]}
        if done[name]["reused"]:
            stored = os.path.relpath(done[name]["log"].parent, out)
            g.stages[name] |= {"log": f"{stored}/pytest.log", "junit": f"{stored}/{reuse.ENTRY}"}
        else:
            g.stages[name] |= {"log": f"{name}/pytest.log", "junit": f"{name}/junit.xml"}
        if kit_stage == name:
            g.stages[name]["kit_tests_s"] = seconds(kit.values())
        else:
            g.stages[name]["kit_results_of"] = kit_stage
            if kit_stage in done and done[kit_stage]["launch"].timed_out:
                shared.append(f"{up.pin.name}: the {name} stage reads its kit tests' results from the {kit_stage} "
                              "stage, which timed out")
    skipped = tuple(up.skipped)
    commits = up.commits or [stack.Commit(1, 1, [], "", [], "no patches")]
    for plan, commit in zip(up.steps, commits, strict=True):
        before, after = up.names[plan.before], up.names[plan.after]
        hidden = tuple(f"{upstream_prefix}{path}" for path in plan.hidden)
        g.steps.append(grading.Step(
            commit.number, commit.of, commit.key if stacked else "",
            {c.key for c in commits[commit.number:]} if stacked else set(), commit.subject,
            ", ".join(p.name for p in commit.patches), results.get(before, {}),
            {k: r for k, r in results.get(after, {}).items() if not k.startswith(hidden)} if hidden else
            results.get(after, {}),
            {f"{upstream_prefix}{key}" for key in commit.fail_to_pass if not key.startswith(skipped)},
            {"before": before, "after": after}))
    g.problems = up.problems + shared
    return g
