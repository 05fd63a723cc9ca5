"""Grading of the gate: JUnit XML in, FAIL_TO_PASS / PASS_TO_PASS verdicts out (report.py writes them).

Pure functions of the stages' results, apart from reading a JUnit file: nothing here launches, checks out or
writes anything (as SWE-bench's harness keeps ``grading.py`` apart from ``run_evaluation.py``); stages.py
runs the stages and report.py writes the report of what these functions return.

Contract (README, "The gate and its report"): a FAIL_TO_PASS test fails with an assertion before and passes
after; every other test (PASS_TO_PASS) passes in both stages. An error, a skip (xfail included), or a test seen in
one stage only is a violation. FAIL_TO_PASS tests are the kit's tests marked ``regression`` (the JUnit property
that scripts/pytest_regression.py writes) and the upstream node ids declared as ``fail_to_pass`` in
``[<name>.gate]`` of upstream/sources.toml. A stack of several commits is judged per commit (``Step``): commit k's
FAIL_TO_PASS tests are its declared ids and the kit's tests marked with its key; the kit's tests of later commits
are not judged at step k; a test that did not pass after k-1 is no guard of step k.
"""

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scripts import KitError

STAGES = ("before", "after")
# Exceptions that re-raise a child process's failure with its traceback in the message: torch.multiprocessing's,
# which ``accelerate.debug_launcher`` (Accelerate's multi-process CPU tests) raises.
CHILD_FAILURE = "torch.multiprocessing.spawn.ProcessRaisedException"
EXCERPT_CHARS = 6000  # of each stage's failure text in a violation's log excerpt


@dataclass
class Result:
    """One test's outcome in one stage: ``passed``, ``failed``, ``error`` or ``skipped``; the JUnit message, the
    ``regression`` property, the element's text (traceback and captured output) and the duration in seconds."""

    outcome: str
    message: str = ""
    regression: str = ""
    text: str = ""
    seconds: float = 0.0


def node_id(case: ET.Element) -> str:
    """Return the pytest node id of an xunit1 ``<testcase>`` (``file::Class::name``, ``file::name``, or ``file`` for
    an item that is a whole file, such as a launched script of scripts/pytest_launch.py)."""
    file, classname, name = case.get("file", ""), case.get("classname", ""), case.get("name", "")
    module = file.removesuffix(".py").replace("/", ".")
    if not classname and name == module:
        return file
    inner = classname[len(module) + 1:].replace(".", "::") if classname.startswith(module + ".") else ""
    return "::".join(part for part in (file, inner, name) if part)


def read_junit(path: Path, rename: Callable[[str], str] = str) -> dict[str, Result]:
    """Return {node id: Result} from the JUnit XML (xunit1) at ``path``, each id passed through ``rename``.

    The same id twice in one run (an error in teardown after a result) is an error. Raises KitError when the file
    is missing or unreadable.
    """
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise KitError(f"{path} is missing or not JUnit XML ({e}): see the pytest log beside it") from None
    results = {}
    for case in root.iter("testcase"):
        outcome, message, text = "passed", "", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message, text = element.get("message", "") or (element.text or ""), element.text or ""
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        key = rename(node_id(case))
        if key in results:
            outcome = "error" if "error" in (outcome, results[key].outcome) else results[key].outcome
        results[key] = Result(outcome, message.strip(), props.get("regression", ""), text.strip(),
                              float(case.get("time") or 0))
    return results


def is_assertion(message: str) -> bool:
    """True when a pytest failure message is an assertion (``assert ...`` / ``AssertionError: ...``).

    For a failure re-raised from a child process (CHILD_FAILURE), the child's last exception decides.
    """
    if message.startswith(("AssertionError", "assert ")):
        return True
    raised = re.findall(r"^([A-Za-z_][\w.]*): ", message, re.M)
    return message.startswith(CHILD_FAILURE) and raised[-1:] == ["AssertionError"]


def first_line(result: Result | None) -> str:
    """The first line of a result's message ('' when there is none)."""
    return result.message.splitlines()[0] if result and result.message else ""


def reason(result: Result | None) -> str:
    """Why a test failed, in one line: its assertion message without the ``AssertionError:`` / ``assert`` prefix;
    for a failure re-raised from a child process (CHILD_FAILURE), the child's last ``AssertionError`` line."""
    line = first_line(result)
    if line.startswith(CHILD_FAILURE):
        raised = re.findall(r"^AssertionError: .*$", result.message, re.M)
        line = raised[-1] if raised else line
    return re.sub(r"^(AssertionError: )?(assert )?", "", line).strip()


def problems_of(contract: str, b: Result | None, a: Result | None, change: str = "the series") -> list[str]:
    """Return the contract violations of one test given its before (``b``) and after (``a``) results of
    ``change`` (the series, or one commit of a stack)."""
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
            problems.append(f"FAIL_TO_PASS test passed before {change} (it does not reproduce the bug)")
        elif not is_assertion(b.message):
            problems.append(f"FAIL_TO_PASS test failed before without an assertion: {first_line(b)}")
        if a.outcome != "passed":
            problems.append(f"FAIL_TO_PASS test failed after {change} (the fix does not fix it): {first_line(a)}")
    else:
        problems += [f"PASS_TO_PASS test failed {stage}: {first_line(r)}"
                     for stage, r in (("before", b), ("after", a)) if r.outcome == "failed"]
    return problems


@dataclass
class Step:
    """One step of an upstream's series: the whole series (``key`` '': every kit test marked ``regression`` for the
    upstream is FAIL_TO_PASS) or commit ``number`` of a stack of ``of`` (``key``: the regression key of the kit tests
    it turns green; marked tests whose key is in ``later`` belong to later commits and are not judged here).

    ``before`` / ``after``: {node id: Result}; upstream tests' ids start with ``upstream/<name>/``, the kit's with
    ``tests/<name>/``. ``fail_to_pass``: the declared upstream ids (with the prefix). ``stages``: {"before", "after"}
    -> the name of the stage each came from; ``subject``, ``patch``: the commit's subject and patch file(s).
    """

    number: int = 1
    of: int = 1
    key: str = ""
    later: set = field(default_factory=set)
    subject: str = ""
    patch: str = ""
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    fail_to_pass: set = field(default_factory=set)
    stages: dict = field(default_factory=dict)

    @property
    def change(self) -> str:
        """What the step judges, in the violations' words: ``the series`` or ``commit 2``."""
        return f"commit {self.number}" if self.key else "the series"


@dataclass
class Upstream:
    """What the gate measured for one upstream, as grading needs it.

    ``steps``: one Step for a series judged as one block, one per commit for a stack. ``keys``: every regression key
    of a stack's commits. ``check``: ``series`` (the whole series) or ``fix`` (only its fix hunks; a release's
    declaration); ``skipped``: upstream test files not run because their hunks do not apply (``fix`` only);
    ``not_run``: {upstream test id: why}, the tests of its upstream test files that the gate deselects (``not_run`` of
    ``[<name>.gate]``: a test that needs a GPU, say), reported, never judged.
    ``problems``: violations found outside the tests (a series that does not apply, a module imported from
    elsewhere). ``series_id``: scripts/stack.series_id of the patches judged. ``stages`` ({stage name: {"commit",
    "wall_s", "holds", ...}}), ``imports``: recorded as they are.
    """

    name: str
    version: str
    base: str
    steps: list = field(default_factory=list)
    series_id: str = ""
    keys: set = field(default_factory=set)
    upstream_tests: bool = False
    check: str = "series"
    reason: str = ""
    skipped: list = field(default_factory=list)
    not_run: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    stages: dict = field(default_factory=dict)
    imports: dict = field(default_factory=dict)

    @property
    def upstream_prefix(self) -> str:
        return f"upstream/{self.name}/"

    @property
    def stacked(self) -> bool:
        """True for a series of several commits judged one by one."""
        return any(step.key for step in self.steps)


def excerpt(key: str, b: Result | None, a: Result | None, problems: list[str]) -> str:
    """The log excerpt of a violating test: its problems, then each stage's failure text (cut to EXCERPT_CHARS)."""
    parts = [f"{key}", *(f"violation: {p}" for p in problems)]
    for stage, result in (("before", b), ("after", a)):
        if result is None:
            parts.append(f"--- {stage}: not run")
        else:
            body = result.text or result.message or "(no output: the test passed)"
            cut = body if len(body) <= EXCERPT_CHARS else "...\n" + body[-EXCERPT_CHARS:]
            parts.append(f"--- {stage}: {result.outcome}\n{cut}")
    return "\n".join(parts) + "\n"


def unexplained(entry: dict) -> list[str]:
    """The FAIL_TO_PASS tests of a report entry whose failure before gives no message of the test's own, only
    pytest's rendering of a bare ``assert`` (``{'a': 0} == {'a': 0}``): they should say what went wrong."""
    tables = [step["tests"] for step in entry.get("steps", [])] or [entry["tests"]]
    return list(dict.fromkeys(key for table in tables for key, r in table.items() if r.get("bare")))


def key_of(result: Result) -> str:
    """The key of a result's ``regression`` property (``deepspeed#8787`` -> ``8787``; '' when unmarked)."""
    return result.regression.partition("#")[2]


def judge_step(up: Upstream, step: Step, excerpts: dict[str, str], broken: set = frozenset()
               ) -> tuple[dict, list[str]]:
    """Return (rows, violations) of one step; add the excerpts of its violating tests to ``excerpts``.

    ``broken``: the tests that did not pass after the step before, whose violations that step reports; here they
    are no guards (a guard is a test that passed after the step before) and their rows say ``"carried": True``.

    rows: {node id: {"contract", "before", "after", "ok", "reason"?, "excerpt"?}} sorted FAIL_TO_PASS first, then
    by id; ``reason`` is the first line of a FAIL_TO_PASS test's assertion message before, ``excerpt`` the path
    (relative to the report) of a violating test's log excerpt. violations: one line each, ``<name> <id>: ...``
    (``<name> <k>/<n> <id>: ...`` for commit k of a stack).
    """
    before, after = step.before, step.after
    label = f"{up.name} {step.number}/{step.of}" if step.key else up.name
    stem = f"{up.name}-{step.number}-" if step.key else f"{up.name}-"
    results = [(k, r) for stage in (before, after) for k, r in stage.items() if r.regression]
    later = {k for k, r in results if step.key and key_of(r) in step.later}
    marked = {k for k, r in results if not step.key or key_of(r) == step.key}
    contracts = {key: "FAIL_TO_PASS" if key in step.fail_to_pass or key in marked else "PASS_TO_PASS"
                 for key in (set(before) | set(after) | step.fail_to_pass) - later}
    rows, violations = {}, []
    for key in sorted(contracts, key=lambda k: (contracts[k] != "FAIL_TO_PASS", k)):
        contract, b, a = contracts[key], before.get(key), after.get(key)
        problems = problems_of(contract, b, a, step.change)
        row = {"contract": contract, "before": b.outcome if b else "missing", "after": a.outcome if a else "missing",
               "ok": not problems}
        if problems and contract == "PASS_TO_PASS" and key in broken:
            rows[key] = {**row, "carried": True}
            continue
        if contract == "FAIL_TO_PASS" and b and b.outcome == "failed":
            row["reason"] = reason(b)
            if first_line(b).startswith("assert "):
                row["bare"] = True
        if problems:
            row["excerpt"] = f"excerpts/{stem}{sum(p.startswith(f'excerpts/{stem}') for p in excerpts) + 1}.txt"
            excerpts[row["excerpt"]] = excerpt(key, b, a, problems)
        rows[key] = row
        violations += [f"{label} {key}: {p}" for p in problems]
    # A gate without FAIL_TO_PASS tests cannot tell the fix from the base.
    if not any(r["contract"] == "FAIL_TO_PASS" for k, r in rows.items() if not k.startswith(up.upstream_prefix)):
        marker = f"`regression({up.name}, {step.key!r})`" if step.key else "`regression`"
        violations.append(f"{label}: no FAIL_TO_PASS test in the kit's suite (no test marked {marker} ran)")
    if up.upstream_tests and not step.fail_to_pass and not up.skipped:
        where = f"[[{up.name}.gate.commits]] {step.number}" if step.key else f"[{up.name}.gate]"
        violations.append(f"{label}: no FAIL_TO_PASS upstream test declared in {where}")
    return rows, violations


def judge(up: Upstream) -> tuple[list[tuple[dict, list[str]]], list[str], dict[str, str]]:
    """Return ([(rows, violations) per step], every violation of the upstream, excerpts {path: text}).

    The upstream's violations are its problems, then each step's (judge_step), then, for a stack, every kit test
    marked with a key that none of its commits has.
    """
    excerpts: dict[str, str] = {}
    judged, broken = [], set()
    for step in up.steps:
        judged.append(judge_step(up, step, excerpts, broken))
        broken = {key for key, row in judged[-1][0].items() if row["after"] != "passed"}
    violations = [*up.problems, *(v for _, found in judged for v in found)]
    if up.stacked:
        stray = sorted({(k, key_of(r)) for step in up.steps for stage in (step.before, step.after)
                        for k, r in stage.items() if r.regression and key_of(r) not in up.keys})
        violations += [f"{up.name} {k}: marked regression({up.name}, {key!r}), a key that no "
                       f"[[{up.name}.gate.commits]] table has" for k, key in stray]
    return judged, violations, excerpts


def contract_lists(rows: dict) -> dict:
    """{"FAIL_TO_PASS": [ids], "PASS_TO_PASS": [ids]} of a step's rows."""
    return {c: [k for k, r in rows.items() if r["contract"] == c] for c in ("FAIL_TO_PASS", "PASS_TO_PASS")}


def summary_of(up: Upstream, judged: list, violations: list[str]) -> dict:
    """The report.json entry of one upstream (see ``report``): a series judged as one block as always; a stack's
    entry adds ``steps``, one per commit ({"commit", "of", "key", "subject", "patch", "stages", "FAIL_TO_PASS",
    "PASS_TO_PASS", "tests", "violations", "verdict"}), its FAIL_TO_PASS every commit's, its PASS_TO_PASS the last
    commit's guards, its ``tests`` the last commit's rows."""
    entry = {"version": up.version, "base": up.base, "series_id": up.series_id, "check": up.check, "reason": up.reason,
             "skipped_upstream_tests": up.skipped, "not_run": up.not_run, "stages": up.stages, "imports": up.imports}
    rows = judged[-1][0] if judged else {}
    if not up.stacked:
        return {**entry, **contract_lists(rows), "tests": rows, "violations": violations,
                "verdict": "fail" if violations else "pass"}
    steps = [{"commit": step.number, "of": step.of, "key": step.key, "subject": step.subject, "patch": step.patch,
              "stages": step.stages, **contract_lists(found), "tests": found, "violations": bad,
              "verdict": "fail" if bad else "pass"} for step, (found, bad) in zip(up.steps, judged, strict=True)]
    every = [k for s in steps for k in s["FAIL_TO_PASS"]]
    return {**entry, "FAIL_TO_PASS": every, "PASS_TO_PASS": [k for k in contract_lists(rows)["PASS_TO_PASS"]
                                                             if k not in every],
            "tests": rows, "steps": steps, "violations": violations, "verdict": "fail" if violations else "pass"}
