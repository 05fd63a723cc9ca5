"""The gate: the suite on the base plus the series' test hunks ("before") and on the full series ("after").

``python -m scripts.gate [--version NAME=VERSION]... [--only NAME] [--out DIR] [--jobs N]`` (``make gate``).

Each stage of each upstream runs in its own ``git worktree`` of the checkout ``upstream/<name>`` under
``<out>/trees/<stage>/<name>`` (scripts/worktree.py): before = ``base/<version>`` + only the series' hunks under
the upstream's ``test_paths`` (and the launched scripts), committed; after = ``base/<version>`` + the series with
``git am --3way``. The checkouts, their branches and tags are never written: the gate judges the files of
``patches/<name>/`` in the kit, whatever the checkouts hold. A release may declare ``check = "fix"`` (with a
one-line ``reason``) in ``[<name>.releases."<version>"]`` of upstream/sources.toml: then before = the base + the
series' test files whose hunks apply there, after = that + the series' other hunks, and the upstream test files
whose hunks do not apply are skipped and listed (issue 13).

A stage is one pytest process (``sys.executable``, so another venv can run the gate) over every upstream's kit
suite ``tests/<name>/``, its ``upstream_tests`` and its ``launch`` scripts (scripts/pytest_launch.py), with the
stage's trees first on ``PYTHONPATH``, its own temporary directories and JUnit XML; the stages run side by side, at
most ``--jobs`` at once (default: the CPU count; ``GATE_JOBS`` in the Makefile), each through scripts/launch.py
(timeout, stack dumps, nothing left running). Every Python process of a stage records where it imported the
upstreams from (scripts/launch_site/sitecustomize.py); a module from outside the stage's tree is a violation.
scripts/grading.py judges FAIL_TO_PASS / PASS_TO_PASS and writes the report: ``<out>/report.{json,md}``, a log
excerpt per violating test in ``<out>/excerpts/``, the stack dumps of timed-out launches in ``<out>/stacks/``, and
per stage ``<out>/<stage>/pytest.log`` and ``junit.xml``. The work trees are removed at the end; those of a run
that was killed are removed by the next. Exit status: 0 with no violation, 1 otherwise, 130 on Ctrl-C.
"""

import argparse
import json
import os
import platform
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from scripts import KitError, grading, launch, runlock, series, sources, worktree
from scripts.checkout import BASE_ENV
from scripts.git import git, rev
from scripts.grading import STAGES

STAGE_TIMEOUT = 1800.0  # seconds of one stage's pytest process
LAUNCH_TIMEOUT = 300.0  # seconds of one launched upstream script
CHECKS = ("series", "fix")
ENVIRONMENT = ("torch", "torchdata", "numpy")  # versions recorded beside Python's


@dataclass
class Upstream:
    """One upstream to gate: pin, checkout, series, its ``[<name>.gate]`` table and the release's declared check;
    then what preparing its stages found (trees, skipped files, problems)."""

    pin: sources.Pin
    repo: Path
    patch_dir: Path
    upstream_tests: list[str]
    fail_to_pass: list[str]
    launches: list[dict]
    check: str = "series"
    reason: str = ""
    trees: dict = field(default_factory=dict)
    commits: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    @property
    def package(self) -> str:
        """The import name of the upstream's package (``accelerate``)."""
        return self.pin.package.replace("-", "_")

    def test_scope(self) -> tuple[str, ...]:
        """What counts as test code of the series: the ``test_paths`` and the launched scripts."""
        return (*self.pin.test_paths, *(entry["script"] for entry in self.launches))

    def package_dir(self, stage: str) -> Path:
        """The directory of the stage's tree that holds the importable package (``src/`` or the tree itself)."""
        return worktree.package_dir(self.trees[stage], self.package)


def fail_to_pass_ids(gate: dict) -> list[str]:
    """The upstream FAIL_TO_PASS node ids of a ``[<name>.gate]`` table: its flat ``fail_to_pass`` (a series of one
    commit), or those of all its ``[[<name>.gate.commits]]`` (a series of several, judged here as one block)."""
    if "fail_to_pass" in gate:
        return list(gate["fail_to_pass"])
    return [test for commit in gate.get("commits", []) for test in commit["fail_to_pass"]]


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
        ups.append(Upstream(pin, repo, args.patches / name, list(gate.get("upstream_tests", [])),
                            fail_to_pass_ids(gate), list(gate.get("launch", [])), check,
                            release.get("reason", "")))
    return ups


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
    """Make the before and after trees of ``up`` under ``root/<stage>/<name>``; record commits, skipped test files
    and problems (a series or fix that does not apply) in ``up``. Raises KitError when git fails otherwise."""
    base = rev(up.repo, f"base/{up.pin.version}")
    patches = series.patch_files(up.patch_dir)
    tests = test_files(patches, up.test_scope())
    for stage in STAGES:
        up.trees[stage] = worktree.add(up.repo, root / stage / up.pin.name, base)
    before, after = up.trees["before"], up.trees["after"]
    if up.check == "fix":
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
        failed = apply_hunks(before, patches, [f"--include={name}" for name in tests]) if tests else ""
        if failed:
            up.problems.append(f"{up.pin.name}: the series' test hunks do not apply to {up.pin.version}: {failed}")
        commit_all(before, "gate: the test hunks of the series")
        failed = worktree.apply_series(after, patches)
        if failed:
            up.problems.append(f"{up.pin.name}: the series does not apply to {up.pin.version} ({failed}); a "
                               "release can declare check = \"fix\" in upstream/sources.toml")
    up.commits = {stage: rev(up.trees[stage]) for stage in STAGES}


# ---------------------------------------------------------------------------------------------------------------
# The stages' runs.


def stage_env(ups: list[Upstream], stage: str, stage_dir: Path) -> dict:
    """The environment of a stage's pytest: the trees first on PYTHONPATH, then the kit; one OpenMP thread; its own
    TMPDIR; the import record of scripts/launch_site/sitecustomize.py."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([*(str(up.package_dir(stage)) for up in ups), str(sources.KIT_ROOT)])
    env["OMP_NUM_THREADS"] = "1"
    env["TMPDIR"] = str(stage_dir / "tmp")
    env["KIT_IMPORT_RECORD"] = str(stage_dir / "imports")
    env["KIT_IMPORT_PACKAGES"] = ",".join(up.package for up in ups)
    return env


def stage_command(ups: list[Upstream], stage: str, stage_dir: Path, root: Path, suites: Path) -> list[str]:
    """The pytest command line of one stage: every upstream's kit suite, upstream tests and launched scripts."""
    paths, launches = [], []
    for up in ups:
        paths.append(str(suites / up.pin.name))
        tree = up.trees[stage]
        paths += [str(tree / test) for test in up.upstream_tests if test not in up.skipped]
        launches += ["--launch=" + json.dumps({**entry, "script": str(tree / entry["script"]),
                                               "nproc": entry.get("nproc", 2)})
                     for entry in up.launches if entry["script"] not in up.skipped]
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
            f"--junitxml={stage_dir / 'junit.xml'}", f"--basetemp={stage_dir / 'tmp' / 'pytest'}", "-q", "-rfEs",
            "-p", "scripts.pytest_regression", "-p", "scripts.pytest_launch", f"--launch-logs={stage_dir / 'launch'}",
            f"--launch-timeout={LAUNCH_TIMEOUT}", f"--rootdir={root}", *launches, *paths]


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
    tree, processes, modules, outside = up.trees[stage].resolve(), 0, set(), set()
    for record in records:
        files = [f for name, f in record["modules"].items() if f and name.partition(".")[0] == up.package]
        processes += bool(files)
        for file in files:
            (modules if Path(file).resolve().is_relative_to(tree) else outside).add(file)
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


def run_stages(ups: list[Upstream], args: argparse.Namespace) -> dict[str, dict]:
    """Run both stages side by side (at most ``args.jobs`` at once); return {stage: {"launch", "results",
    "records"}} with the JUnit results renamed for the report. A stage that times out is killed after its stacks are
    written to its log, and recorded as a problem of every upstream. Raises KitError when a stage that ended wrote no
    JUnit XML."""
    root = args.suites.resolve().parent
    jobs = []
    for stage in STAGES:
        stage_dir = (args.out / stage).resolve()
        (stage_dir / "tmp").mkdir(parents=True)
        (stage_dir / "imports").mkdir()
        command = stage_command(ups, stage, stage_dir, root, args.suites.resolve())
        jobs.append(launch.Job(command, stage_dir / "pytest.log", args.timeout, cwd=sources.KIT_ROOT,
                               env=stage_env(ups, stage, stage_dir)))
    done = {}
    for stage, job, result in zip(STAGES, jobs, launch.run_all(jobs, args.jobs), strict=True):
        stage_dir, results = job.log.parent, {}
        if result.timed_out:  # every test of the stage is then missing: violations, and the report says why
            for up in ups:
                up.problems.append(f"{up.pin.name}: the {stage} stage timed out after {args.timeout:.0f} s and was "
                                   f"killed; the stacks of its processes are in stacks/{stage}-pytest.log")
        else:
            results = grading.read_junit(stage_dir / "junit.xml", renamer(ups, stage, root))
        done[stage] = {"launch": result, "results": results, "records": read_records(stage_dir / "imports")}
        outcomes = Counter(r.outcome for r in results.values())
        print(f"gate {stage}: {', '.join(f'{n} {o}' for o, n in sorted(outcomes.items())) or 'no tests'} in "
              f"{result.seconds} s (log: {os.path.relpath(job.log)})", flush=True)
    return done


# ---------------------------------------------------------------------------------------------------------------
# The report.


def environment() -> dict:
    """Versions of Python and of ENVIRONMENT in the interpreter that ran the stages (this one)."""
    versions = {"python": platform.python_version()}
    for name in ENVIRONMENT:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def series_source(patches: Path) -> dict:
    """The kit commit the series come from and the files of ``patches`` that differ from it ({} outside git)."""
    head = git(patches, "rev-parse", "HEAD", check=False)
    if head.returncode != 0:
        return {}
    status = git(patches, "status", "--porcelain", "--", ".", check=False).stdout.splitlines()
    return {"kit_commit": head.stdout.strip(), "uncommitted": [line[3:] for line in status]}


def seconds(results) -> float:
    """The sum of the JUnit durations of ``results`` (s), rounded to 0.1."""
    return round(sum(r.seconds for r in results), 1)


def graded(up: Upstream, done: dict, root: Path, suites: Path) -> grading.Upstream:
    """The grading record of ``up``: its results of both stages, declared ids, imports, times."""
    kit_prefix = f"{os.path.relpath(suites / up.pin.name, root)}/"
    prefixes = (kit_prefix, f"upstream/{up.pin.name}/")
    g = grading.Upstream(up.pin.name, up.pin.version, rev(up.repo, f"base/{up.pin.version}"), check=up.check,
                         reason=up.reason, skipped=up.skipped, upstream_tests=bool(up.upstream_tests or up.launches))
    skipped = tuple(up.skipped)
    g.fail_to_pass = {f"upstream/{up.pin.name}/{key}" for key in up.fail_to_pass if not key.startswith(skipped)}
    for stage in STAGES:
        if stage not in done:
            continue
        mine = {k: r for k, r in done[stage]["results"].items() if k.startswith(prefixes)}
        setattr(g, stage, mine)
        g.imports[stage] = check_imports(up, stage, done[stage]["records"])
        g.stages[stage] = {"commit": up.commits.get(stage, ""), "wall_s": done[stage]["launch"].seconds,
                           "kit_tests_s": seconds(r for k, r in mine.items() if k.startswith(kit_prefix)),
                           "upstream_tests_s": seconds(r for k, r in mine.items() if not k.startswith(kit_prefix)),
                           "log": f"{stage}/pytest.log"}
    g.problems = up.problems
    return g


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the gate's options (paths default to the kit's own layout)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.gate", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="gate this upstream only")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--suites", type=Path, default=sources.KIT_ROOT / "tests", help="holds tests/<name>/")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "gate")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="stages run at once (default: the CPU count)")
    parser.add_argument("--timeout", type=float, default=STAGE_TIMEOUT, help="seconds per stage")
    parser.add_argument("--keep-trees", action="store_true", help="leave the stages' work trees in <out>/trees/")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    root = args.suites.resolve().parent
    if not args.out.is_relative_to(root):
        parser.error(f"--out {args.out} must lie inside {root}: the stages' node ids are paths relative to it")
    return args


def clean(ups: list[Upstream], out: Path) -> None:
    """Remove what a previous run left in ``out`` (work trees of a killed run included), the report first; kill the
    processes a killed run left running (those whose stage environment points into ``out``)."""
    killed = launch.kill_by_environment("KIT_IMPORT_RECORD", f"{out}{os.sep}")
    if killed:
        print(f"gate: killed {len(killed)} processes a previous run left running", flush=True)
    for name in ("report.json", "report.md"):
        (out / name).unlink(missing_ok=True)
    for up in ups:
        worktree.clean(up.repo, out / "trees")
    for name in ("trees", *STAGES, "excerpts", "stacks"):
        shutil.rmtree(out / name, ignore_errors=True)


def gate(args: argparse.Namespace) -> int:
    """Prepare, run both stages, judge, report; return the exit status."""
    started = time.monotonic()
    ups = load_upstreams(args)
    clean(ups, args.out)
    try:
        for up in ups:
            prepare(up, args.out / "trees")
        runnable = [up for up in ups if not up.problems]
        done = run_stages(runnable, args) if runnable else {}
        root = args.suites.resolve().parent
        stacks = [path for stage in STAGES if stage in done for path in collect_stacks(args.out / stage, args.out)]
    finally:
        if not args.keep_trees:
            for up in ups:
                for tree in up.trees.values():
                    worktree.remove(up.repo, tree)
            shutil.rmtree(args.out / "trees", ignore_errors=True)
    ups_graded = [graded(up, done if up in runnable else {}, root, args.suites.resolve()) for up in ups]
    meta = {"wall_s": round(time.monotonic() - started, 1), "versions": environment(),
            "series": series_source(args.patches), "jobs": args.jobs, "stacks": stacks}
    doc, md, excerpts = grading.report(ups_graded, meta)
    for stage in STAGES:
        shutil.rmtree(args.out / stage / "tmp", ignore_errors=True)
    for path, text in excerpts.items():
        (args.out / path).parent.mkdir(parents=True, exist_ok=True)
        (args.out / path).write_text(text)
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "report.md").write_text(md)
    print(f"\ngate: {doc['verdict'].upper()} in {doc['wall_s']} s; report in {os.path.relpath(args.out)}/report.md")
    for name, entry in doc["upstreams"].items():
        print(f"  {name} {entry['version']} ({entry['check']}): FAIL_TO_PASS {len(entry['FAIL_TO_PASS'])}, "
              f"PASS_TO_PASS {len(entry['PASS_TO_PASS'])}, violations {len(entry['violations'])}")
        for violation in entry["violations"]:
            print(f"  violation: {violation}")
    return 0 if doc["verdict"] == "pass" else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: return 0 with no violation, 1 otherwise or on KitError (one line on stderr), 130 on Ctrl-C."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        return gate(args)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gate: interrupted; the stages were stopped and their work trees removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
