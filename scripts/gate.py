"""The gate: the suite on the base plus the series' test hunks ("before"), then on the full series ("after").

Contract (README, "The gate and its report"; SWE-bench's FAIL_TO_PASS / PASS_TO_PASS): a
FAIL_TO_PASS test fails with an assertion before and passes after; every other test passes in both stages.
An error, a skip (xfail included), or a test seen in one stage only is a violation. FAIL_TO_PASS tests are
the kit's tests marked ``regression`` (read from the JUnit property the plugin scripts/pytest_regression.py
writes) and the upstream node ids listed as ``fail_to_pass`` in ``[<name>.gate]`` of upstream/sources.toml.

Each stage runs, in one pytest process, every upstream's kit suite ``tests/<name>/`` and its upstream test
files listed as ``upstream_tests`` (``upstream/<name>/...``), writing JUnit XML (xunit1, which names the file)
to ``build/gate/<stage>.xml`` and pytest's output to ``<stage>.log``. The report goes to
``build/gate/report.{json,md}``.
The checkouts are left with the series applied. Exit status: 0 with no violation, 1 otherwise.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from scripts import KitError, checkout, series, sources
from scripts.checkout import git, rev

GATE_REF = "refs/kit/gate-before"
STAGES = ("before", "after")


@dataclass
class Result:
    """One test's outcome in one stage: ``passed``, ``failed``, ``error`` or ``skipped``, and the message."""

    outcome: str
    message: str = ""
    regression: str = ""


@dataclass
class Upstream:
    """What the gate knows of one upstream: pin, checkout, series, upstream tests and declared FAIL_TO_PASS."""

    pin: sources.Pin
    repo: Path
    patch_dir: Path
    upstream_tests: list[str]
    fail_to_pass: list[str]
    results: dict = field(default_factory=lambda: {stage: {} for stage in STAGES})
    stages: dict = field(default_factory=dict)
    prefix: str = ""  # node-id prefix of its upstream tests: the checkout relative to the kit's root


def node_id(case: ET.Element) -> str:
    """Return the pytest node id of an xunit1 ``<testcase>`` (``file::Class::name`` or ``file::name``)."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    module = file.removesuffix(".py").replace("/", ".")
    inner = classname[len(module) + 1:].replace(".", "::") if classname.startswith(module + ".") else ""
    return "::".join(part for part in (file, inner, name) if part)


def read_junit(path: Path) -> dict[str, Result]:
    """Return {node id: Result} from the JUnit XML at ``path``; raise KitError if it is missing or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise KitError(f"{path} is missing or not JUnit XML ({e}): see the pytest output above") from None
    results = {}
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = element.get("message", "") or (element.text or "")
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        key = node_id(case)
        if key in results:  # the same id twice in one run: an error in setup/teardown after a result
            outcome = "error" if "error" in (outcome, results[key].outcome) else results[key].outcome
        results[key] = Result(outcome, message.strip(), props.get("regression", ""))
    return results


def pytest_command(python: str, junit: Path, jobs: str, paths: list[str], plugin: bool) -> list[str]:
    """The pytest command line of one run: xunit1 JUnit at ``junit``, ``-n jobs`` unless jobs is '0'."""
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_family=xunit1", f"--junitxml={junit}",
               "-q", "-rfEs"]
    if plugin:
        command += ["-p", "scripts.pytest_regression"]
    if jobs != "0":
        command += ["-n", jobs]
    return command + paths


def run_stage(stage: str, ups: list[Upstream], suites: Path, out: Path, python: str, jobs: str) -> None:
    """Run every upstream's kit suite and upstream tests in ONE pytest process; store ``Upstream.results``.

    One process per stage pays the interpreter and the imports of torch, DeepSpeed and Accelerate once (``make bench
    BENCH_ARGS=--profile-gate``: a stage took 26.5 s that way against 41.9 s as four runs). Node ids are relative
    to the parent of ``suites`` (the kit's root): kit tests ``tests/<name>/...``, upstream tests
    ``upstream/<name>/...``, so the two never mix. pytest's output goes to ``<out>/<stage>.log``; the terminal
    gets one line per upstream.
    """
    root = suites.resolve().parent
    paths = []
    for up in ups:
        paths += [str(suites / up.pin.name), *(str(up.repo / path) for path in up.upstream_tests)]
    xml, log = out / f"{stage}.xml", out / f"{stage}.log"
    xml.unlink(missing_ok=True)
    started = time.monotonic()
    with open(log, "w") as output:
        command = pytest_command(python, xml.resolve(), jobs, [f"--rootdir={root}", *paths], True)
        output.write(f"$ (cd {sources.KIT_ROOT} && {' '.join(command)})\n")
        output.flush()
        subprocess.run(command, cwd=sources.KIT_ROOT, stdout=output, stderr=subprocess.STDOUT)
    results = read_junit(xml)
    wall_s = round(time.monotonic() - started, 1)
    for up in ups:
        prefixes = (f"{os.path.relpath(suites.resolve() / up.pin.name, root)}/", up.prefix)
        mine = {key: result for key, result in results.items() if key.startswith(prefixes)}
        up.results[stage].update(mine)
        outcomes = Counter(result.outcome for result in mine.values())
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items()))
        print(f"gate {stage} {up.pin.name}: {summary or 'no tests'} (log: {os.path.relpath(log)})", flush=True)
        up.stages[stage] = {"commit": rev(up.repo), "wall_s": wall_s}
    print(f"gate {stage}: {wall_s} s", flush=True)


# Exceptions that re-raise a child process's failure with its traceback in the message: torch.multiprocessing's,
# which ``accelerate.debug_launcher`` (Accelerate's multi-process CPU tests) raises.
CHILD_FAILURE = "torch.multiprocessing.spawn.ProcessRaisedException"


def is_assertion(message: str) -> bool:
    """True when a pytest failure message is an assertion (``assert ...`` / ``AssertionError: ...``).

    For a failure re-raised from a child process (CHILD_FAILURE), the child's last exception decides.
    """
    if message.startswith(("AssertionError", "assert ")):
        return True
    raised = re.findall(r"^([A-Za-z_][\w.]*): ", message, re.M)
    return message.startswith(CHILD_FAILURE) and raised[-1:] == ["AssertionError"]


def first_line(result: Result) -> str:
    """The first line of a result's message ('' when there is none)."""
    return result.message.splitlines()[0] if result.message else ""


def problems_of(contract: str, b: Result | None, a: Result | None) -> list[str]:
    """Return the contract violations of one test given its before (``b``) and after (``a``) results."""
    problems = []
    for stage, result in (("before", b), ("after", a)):
        if result is None:
            problems.append(f"missing {stage}")
        elif result.outcome in ("error", "skipped"):
            problems.append(f"{result.outcome} {stage}: {first_line(result)}")
    if problems:
        return problems
    if contract == "FAIL_TO_PASS":
        if b.outcome == "passed":
            problems.append("FAIL_TO_PASS test passed before the series (it does not reproduce the bug)")
        elif not is_assertion(b.message):
            problems.append(f"FAIL_TO_PASS test failed before without an assertion: {first_line(b)}")
        if a.outcome != "passed":
            problems.append("FAIL_TO_PASS test failed after the series (the fix does not fix it)")
    else:
        problems += [f"PASS_TO_PASS test failed {stage}: {first_line(r)}"
                     for stage, r in (("before", b), ("after", a)) if r.outcome == "failed"]
    return problems


def judge(up: Upstream) -> tuple[dict, list[str]]:
    """Return ({node id: row}, violations) of one upstream; a row holds the contract and both outcomes."""
    before, after = up.results["before"], up.results["after"]
    declared = {up.prefix + key for key in up.fail_to_pass}
    marked = {k for stage in (before, after) for k, r in stage.items() if r.regression}
    rows, violations = {}, []
    for key in sorted(set(before) | set(after) | declared):
        contract = "FAIL_TO_PASS" if key in declared or key in marked else "PASS_TO_PASS"
        b, a = before.get(key), after.get(key)
        problems = problems_of(contract, b, a)
        rows[key] = {"contract": contract, "before": b.outcome if b else "missing",
                     "after": a.outcome if a else "missing", "ok": not problems}
        violations += [f"{up.pin.name} {key}: {p}" for p in problems]
    # A gate without FAIL_TO_PASS tests cannot tell the fix from the base.
    if not any(r["contract"] == "FAIL_TO_PASS" for k, r in rows.items() if not k.startswith(up.prefix)):
        violations.append(f"{up.pin.name}: no FAIL_TO_PASS test in the kit's suite (no test marked `regression` ran)")
    if up.upstream_tests and not up.fail_to_pass:
        violations.append(f"{up.pin.name}: no FAIL_TO_PASS upstream test declared in [{up.pin.name}.gate]")
    return rows, violations


def refuse_if_not_ready(up: Upstream) -> None:
    """Raise KitError, changing nothing, unless the checkout holds its base and no work of the user's that
    switching it could lose (uncommitted changes, unfinished git operations, unexported commits)."""
    series.require_base(up.repo, up.pin.version)
    checkout.refuse_if_dirty(up.repo, "running the gate")
    if not series.matches(up.repo, f"base/{up.pin.version}", up.patch_dir):
        series.refuse_if_unexported(up.repo, up.pin.version, up.patch_dir, "running the gate")


def prepare_before(up: Upstream) -> None:
    """Check out ``base`` + only the series' hunks under ``test_paths``, committed on ``gate/before/<version>``."""
    repo, version = up.repo, up.pin.version
    git(repo, "checkout", "--quiet", "-B", f"gate/before/{version}", f"base/{version}")
    includes = [f"--include={path.rstrip('/')}/*" for path in up.pin.test_paths]
    for patch in series.patch_files(up.patch_dir):
        if series.touches(patch, up.pin.test_paths):
            git(repo, "apply", "--index", *includes, str(patch))
    if git(repo, "diff", "--cached", "--quiet", check=False).returncode != 0:
        git(repo, "commit", "--quiet", "--message", "gate: the test hunks of the series", env=checkout.BASE_ENV)
    git(repo, "update-ref", GATE_REF, "HEAD")


def restore(up: Upstream) -> None:
    """Put a checkout the gate left on ``gate/before/<version>`` (error, Ctrl-C) back on the series."""
    on = checkout.current_branch(up.repo)
    if on == f"gate/before/{up.pin.version}" and not checkout.uncommitted(up.repo):
        print(series.apply(up.repo, up.pin.version, up.patch_dir), file=sys.stderr)


def load_upstreams(args: argparse.Namespace) -> list[Upstream]:
    """Build the Upstream records of the selected upstreams from the pins file."""
    table = sources.load(args.sources)
    names = [args.only] if args.only else list(table)
    chosen = sources.versions(args.version)
    ups = []
    for name in names:
        pin = sources.pin(name, chosen.get(name), args.sources)
        gate = table[name].get("gate", {})
        if not (args.checkouts / name / ".git").is_dir():
            raise KitError(f"{args.checkouts / name} does not exist: run `make apply` first")
        prefix = f"{os.path.relpath((args.checkouts / name).resolve(), args.suites.resolve().parent)}/"
        ups.append(Upstream(pin, args.checkouts / name, args.patches / name, gate.get("upstream_tests", []),
                            gate.get("fail_to_pass", []), prefix=prefix))
    return ups


def write_report(ups: list[Upstream], judged: dict, out: Path, wall_s: float) -> dict:
    """Write ``report.json`` and ``report.md`` into ``out``; return the JSON document."""
    doc = {"verdict": "pass" if not any(v for _, v in judged.values()) else "fail", "wall_s": round(wall_s, 1),
           "python": platform.python_version(), "upstreams": {}}
    md = ["# Gate report", "", f"Verdict: **{doc['verdict'].upper()}** (wall time {doc['wall_s']} s)", ""]
    for up in ups:
        rows, violations = judged[up.pin.name]
        f2p = [k for k, r in rows.items() if r["contract"] == "FAIL_TO_PASS"]
        p2p = [k for k, r in rows.items() if r["contract"] == "PASS_TO_PASS"]
        base = rev(up.repo, f"base/{up.pin.version}")
        doc["upstreams"][up.pin.name] = {"version": up.pin.version, "base": base, "stages": up.stages,
                                         "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "tests": rows,
                                         "violations": violations}
        md += [f"## {up.pin.name} {up.pin.version}", "",
               f"before = `{up.stages['before']['commit'][:12]}`: the base `{base[:12]}` + only the series' test "
               f"hunks; after = `{up.stages['after']['commit'][:12]}`: the base + the series. Kit tests are "
               f"`tests/{up.pin.name}/...`; upstream tests `upstream/{up.pin.name}/...` (in the upstream's tree).", "",
               f"FAIL_TO_PASS: {len(f2p)}, PASS_TO_PASS: {len(p2p)}, violations: {len(violations)}.", "",
               "| test | contract | before | after | ok |", "|---|---|---|---|---|"]
        md += [f"| `{k}` | {r['contract']} | {r['before']} | {r['after']} | {'yes' if r['ok'] else '**no**'} |"
               for k, r in rows.items()]
        md += [""] + [f"- violation: {v}" for v in violations] + ([""] if violations else [])
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "report.md").write_text("\n".join(md) + "\n")
    return doc


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
    parser.add_argument("--jobs", default="0", help="pytest-xdist workers for the kit's suite ('0': none)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run both stages, judge, report; return 0 with no violation, 1 otherwise (or on KitError)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    ups = []
    try:
        ups = load_upstreams(args)
        for up in ups:
            refuse_if_not_ready(up)
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            for up in ups:
                prepare_before(up)
            run_stage("before", ups, args.suites, args.out, sys.executable, args.jobs)
            for up in ups:
                print(series.apply(up.repo, up.pin.version, up.patch_dir))
            run_stage("after", ups, args.suites, args.out, sys.executable, args.jobs)
        finally:
            for up in ups:
                restore(up)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    judged = {up.pin.name: judge(up) for up in ups}
    doc = write_report(ups, judged, args.out, time.monotonic() - started)
    print(f"\ngate: {doc['verdict'].upper()} in {doc['wall_s']} s; report in {args.out}/report.md")
    for name, entry in doc["upstreams"].items():
        print(f"  {name} {entry['version']}: FAIL_TO_PASS {len(entry['FAIL_TO_PASS'])}, "
              f"PASS_TO_PASS {len(entry['PASS_TO_PASS'])}, violations {len(entry['violations'])}")
        for violation in entry["violations"]:
            print(f"  violation: {violation}")
    return 0 if doc["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
