"""The gate: the suite on the base plus the series' test hunks ("before") and on the full series ("after").

The package: this module (the command line: prepare, run, judge, report, clean up), stages.py (the stages' trees and
their pytest processes), grading.py (JUnit in, FAIL_TO_PASS / PASS_TO_PASS verdicts out), report.py (report.json and
report.md).

``python -m scripts.gate [--version NAME=VERSION]... [--only NAME] [--out DIR] [--jobs N]`` (``make gate``).

Each stage of each upstream runs in its own tree (a shared clone) of the checkout ``upstream/<name>`` under
``<out>/trees/<stage>/<name>`` (scripts/worktree.py): before = ``base/<version>`` + only the series' hunks under
the upstream's ``test_paths`` (and the launched scripts), committed; after = ``base/<version>`` + the series with
``git am --3way``. The checkouts, their branches and tags are never written: the gate judges the files of
``patches/<name>/`` in the kit, whatever the checkouts hold. A release may declare ``check = "fix"`` (with a
one-line ``reason``) in ``[<name>.releases."<version>"]`` of upstream/sources.toml: then before = the base + the
series' test files whose hunks apply there, after = that + the series' other hunks, and the upstream test files
whose hunks do not apply are skipped and listed (issue 13).

A series of several commits (``[[<name>.gate.commits]]``, scripts/stack.py) is judged commit by commit: commit k on
*before k* = the base + commits 1..k-1 + only its test hunks and *after k* = the base + commits 1..k; the stages are
planned by scripts/stack.plan (after k shared with before k+1 when commit k+1 only adds test files) and named
``stage-0``, ``stage-1``, ... (every upstream's i-th stage runs in the i-th pytest process). A stack whose tables do
not match its patches, or whose commit's test hunks do not apply to the commits before it, is refused in one line
before anything is written.

A stage is one pytest process (``sys.executable``, so another venv can run the gate) over every upstream's kit
suite ``tests/<name>/`` (run once per code: a stage whose tree holds the same files as an earlier stage's outside the
test paths and launched scripts collects it but deselects it, and reads that stage's results, ``kit_stages``), its
``upstream_tests`` and its ``launch`` scripts (scripts/pytest_launch.py), with the stage's trees first on
``PYTHONPATH``, its own temporary directories and JUnit XML; the stages run side by side, at most ``--jobs`` at once
(default: the CPU count; ``GATE_JOBS`` in the Makefile), each through scripts/launch.py (timeout, stack dumps,
nothing left running). Every Python process of a stage records where it imported the
upstreams from (scripts/launch_site/sitecustomize.py); a module from outside the stage's tree is a violation.
grading.py judges FAIL_TO_PASS / PASS_TO_PASS and report.py writes the report: ``<out>/report.{json,md}``, a log
excerpt per violating test in ``<out>/excerpts/``, the stack dumps of timed-out launches in ``<out>/stacks/``, and
per stage ``<out>/<stage>/pytest.log`` and ``junit.xml``. A run that starts removes the previous run's report with its
evidence; one that ends without a verdict (Ctrl-C, an error) writes a ``report.md`` that says so, and no
``report.json``. The trees and the stages' temporary files are removed at the end and on Ctrl-C; those
of a run that was killed are removed by the next; while the stages run, one line every PROGRESS_S seconds says how
far each got (scripts/pytest_progress.py): its role (before / after commit k), its tests done, whether its failures are
the expected ones (the FAIL_TO_PASS tests before their fix), and a test it has been running for PROGRESS_S or more;
then the judging says what it does too. Exit status: 0 with no violation, 1 otherwise, 130 on Ctrl-C.
"""


import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from scripts import ArgumentParser, KitError, launch, outdated, sources, worktree
from scripts.gate import report, stages
from scripts.gate.stages import STAGE_TIMEOUT, Upstream

DEFAULT_OUT = sources.KIT_ROOT / "build" / "gate"  # where make gate reports; make pr writes beside it (build/pr/)
REPORTS = ("report.json", "report.md")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the gate's options (paths default to the kit's own layout)."""
    parser = ArgumentParser(prog="python -m scripts.gate", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="gate this upstream only")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--suites", type=Path, default=sources.KIT_ROOT / "tests", help="holds tests/<name>/")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="stages run at once (default: the CPU count)")
    parser.add_argument("--timeout", type=float, default=STAGE_TIMEOUT, help="seconds per stage")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="run every stage, reusing no stored result (GATE_CACHE=0); the results are stored anew")
    parser.add_argument("--cache-dir", type=Path, help="where stage results are kept (default: <out>/../gate-cache)")
    parser.add_argument("--keep-trees", action="store_true", help="leave the stages' trees in <out>/trees/")
    parser.add_argument("--outdated", type=Path, default=outdated.RECORD, help="the record of the last make outdated")
    args = parser.parse_args(argv)
    args.out, args.patches, args.checkouts = args.out.resolve(), args.patches.resolve(), args.checkouts.resolve()
    args.cache_dir = (args.cache_dir or args.out.parent / "gate-cache").resolve()
    root = args.suites.resolve().parent
    if not args.out.is_relative_to(root):
        parser.error(f"--out {args.out} must lie inside {root}: the stages' node ids are paths relative to it")
    return args


def clean(ups: list[Upstream], out: Path) -> None:
    """Remove what a previous run left in ``out``: its stages' logs and JUnit XML, excerpts, stack dumps and trees
    (a killed run's included), and its report with them, so that no report claims a verdict whose evidence is gone
    (issue 33: an interrupted run left a PASS report linking the aborted run's logs); kill the processes a killed
    run left running (those whose stage environment points into ``out``)."""
    killed = launch.kill_by_environment("KIT_IMPORT_RECORD", f"{out}{os.sep}")
    if killed:
        print(f"gate: killed {len(killed)} processes a previous run left running", flush=True)
    for up in ups:
        worktree.clean(up.repo, out / "trees")
    stages = [p.name for p in out.glob("stage-*")] + ["before", "after"]
    for name in ("trees", *stages, "excerpts", "stacks"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in REPORTS:
        (out / name).unlink(missing_ok=True)


def write_unfinished(out: Path, why: str, started: float) -> None:
    """Write ``report.md`` of a run that ended without a verdict (``why``: interrupted, or the error); no
    ``report.json``, so that ``make pr`` and the bench find no result to use."""
    logs = sorted(path.relative_to(out).as_posix() for path in out.glob("*/pytest.log"))
    (out / "report.md.new").write_text(report.unfinished_markdown(why, round(time.monotonic() - started, 1), logs))
    os.replace(out / "report.md.new", out / "report.md")


def gate(args: argparse.Namespace) -> int:
    """Prepare, run the stages, judge, report; return the exit status. Once the previous run's evidence is removed
    (``clean``), a run that does not reach its report (Ctrl-C, an error) writes one that says so and claims no
    verdict; the stages' trees and temporary files are removed whatever happens."""
    started = time.monotonic()
    ups = stages.load_upstreams(args)  # a refusal here leaves the previous report and its evidence as they are
    clean(ups, args.out)
    try:
        return judge_and_report(ups, args, started)
    except KeyboardInterrupt:
        write_unfinished(args.out, "the run was interrupted", started)
        raise
    except KitError as e:
        write_unfinished(args.out, f"error: {e}", started)
        raise
    finally:
        remove_trees(ups, args)


def judge_and_report(ups: list[Upstream], args: argparse.Namespace, started: float) -> int:
    """Make the stages' trees, run the stages, judge them (grading.py) and write the report; return the exit
    status."""
    for up in ups:
        stages.prepare(up, args.out / "trees")
    runnable = [up for up in ups if not up.problems]
    run_id = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    done = stages.run_stages(runnable, args, run_id) if runnable else {}
    print("gate: judging the stages, writing the report and removing the stages' trees", flush=True)
    with stages.progress_lines(lambda: ["still judging the stages and removing their trees"], stages.PROGRESS_S):
        root = args.suites.resolve().parent
        stacks = [path for stage in stages.stage_names(ups) if (args.out / stage).is_dir()
                  for path in stages.collect_stacks(args.out / stage, args.out)]
        ups_graded = [stages.graded(up, done.get(up.pin.name, {}), root, args.suites.resolve(), args.out)
                      for up in ups]
        record = outdated.load_record(args.outdated)  # the last `make outdated`: is each base the newest release?
        meta = {"wall_s": round(time.monotonic() - started, 1), "versions": report.environment(),
                "flows": report.flows_records(), "series": report.series_source(args.patches), "jobs": args.jobs,
                "stacks": stacks, "run": run_id,
                "cache": {"on": args.cache, "dir": os.path.relpath(args.cache_dir, args.out)},
                "releases": {up.pin.name: outdated.release_status(record, up.pin.package, up.pin.version)
                             for up in ups}}
        doc, md, excerpts = report.build(ups_graded, meta)
        for path, text in excerpts.items():
            (args.out / path).parent.mkdir(parents=True, exist_ok=True)
            (args.out / path).write_text(text)
        for name, text in zip(REPORTS, (json.dumps(doc, indent=2) + "\n", md), strict=True):
            (args.out / f"{name}.new").write_text(text)
            os.replace(args.out / f"{name}.new", args.out / name)  # a reader sees the whole file or none
        if args.out == DEFAULT_OUT:
            report.remove_stale_bodies(doc, DEFAULT_OUT.parent / "pr")
        remove_trees(ups, args)
    print(f"\ngate: {doc['verdict'].upper()} in {round(time.monotonic() - started, 1)} s; report in "
          f"{os.path.relpath(args.out)}/report.md")
    for line in report.summary_lines(doc):
        print(line)
    return 0 if doc["verdict"] == "pass" else 1


def remove_trees(ups: list[Upstream], args: argparse.Namespace) -> None:
    """Remove the stages' trees (unless ``--keep-trees``) and temporary files; idempotent."""
    if not args.keep_trees:
        for up in ups:
            for tree in up.trees.values():
                worktree.remove(tree)
        shutil.rmtree(args.out / "trees", ignore_errors=True)
    for stage in stages.stage_names(ups):
        shutil.rmtree(args.out / stage / "tmp", ignore_errors=True)


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
        trees = args.out / "trees"
        left = (f"their trees are left in {os.path.relpath(trees)} (the next run removes them)" if trees.exists()
                else f"no stage tree is left in {os.path.relpath(trees)}")
        unfinished = (args.out / "report.md").exists() and not (args.out / "report.json").exists()
        said = f"; {os.path.relpath(args.out)}/report.md says that this run has no verdict" if unfinished else ""
        print(f"gate: interrupted; the stages were stopped and {left}; the checkouts were not touched{said}",
              file=sys.stderr)
        return 130
