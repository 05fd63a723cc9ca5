"""Grading of the gate: JUnit XML in, FAIL_TO_PASS / PASS_TO_PASS verdicts and the report out.

Pure functions of the stages' results, apart from reading a JUnit file: nothing here launches, checks out or
writes anything (as SWE-bench's harness keeps ``grading.py`` apart from ``run_evaluation.py``); ``scripts/gate.py``
runs the stages and writes what these functions return.

Contract (README, "The gate and its report"): a FAIL_TO_PASS test fails with an assertion before and passes
after; every other test (PASS_TO_PASS) passes in both stages. An error, a skip (xfail included), or a test seen in
one stage only is a violation. FAIL_TO_PASS tests are the kit's tests marked ``regression`` (the JUnit property
that scripts/pytest_regression.py writes) and the upstream node ids declared as ``fail_to_pass`` in
``[<name>.gate]`` of upstream/sources.toml.
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
            problems.append(f"FAIL_TO_PASS test failed after the series (the fix does not fix it): {first_line(a)}")
    else:
        problems += [f"PASS_TO_PASS test failed {stage}: {first_line(r)}"
                     for stage, r in (("before", b), ("after", a)) if r.outcome == "failed"]
    return problems


@dataclass
class Upstream:
    """What the gate measured for one upstream, as grading needs it.

    ``before`` / ``after``: {node id: Result}; upstream tests' ids start with ``upstream_prefix``
    (``upstream/<name>/``), the kit's with ``tests/<name>/``. ``fail_to_pass``: the declared upstream ids (with the
    prefix). ``check``: ``series`` (the whole series) or ``fix`` (only its fix hunks; a release's declaration);
    ``skipped``: upstream test files not run because their hunks do not apply (``fix`` only). ``problems``:
    violations found outside the tests (a series that does not apply, a module imported from elsewhere).
    ``stages``, ``imports``: recorded in the report as they are.
    """

    name: str
    version: str
    base: str
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    fail_to_pass: set = field(default_factory=set)
    upstream_tests: bool = False
    check: str = "series"
    reason: str = ""
    skipped: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    stages: dict = field(default_factory=dict)
    imports: dict = field(default_factory=dict)

    @property
    def upstream_prefix(self) -> str:
        return f"upstream/{self.name}/"


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


def judge(up: Upstream) -> tuple[dict, list[str], dict[str, str]]:
    """Return (rows, violations, excerpts) of one upstream.

    rows: {node id: {"contract", "before", "after", "ok", "reason"?, "excerpt"?}} sorted FAIL_TO_PASS first, then
    by id; ``reason`` is the first line of a FAIL_TO_PASS test's assertion message before the series, ``excerpt``
    the path (relative to the report) of a violating test's log excerpt. violations: one line each.
    excerpts: {path: text} to write beside the report.
    """
    before, after = up.before, up.after
    marked = {k for stage in (before, after) for k, r in stage.items() if r.regression}
    contracts = {key: "FAIL_TO_PASS" if key in up.fail_to_pass or key in marked else "PASS_TO_PASS"
                 for key in set(before) | set(after) | up.fail_to_pass}
    rows, violations, excerpts = {}, list(up.problems), {}
    for key in sorted(contracts, key=lambda k: (contracts[k] != "FAIL_TO_PASS", k)):
        contract, b, a = contracts[key], before.get(key), after.get(key)
        problems = problems_of(contract, b, a)
        row = {"contract": contract, "before": b.outcome if b else "missing", "after": a.outcome if a else "missing",
               "ok": not problems}
        if contract == "FAIL_TO_PASS" and b and b.outcome == "failed":
            row["reason"] = reason(b)
        if problems:
            row["excerpt"] = f"excerpts/{up.name}-{len(excerpts) + 1}.txt"
            excerpts[row["excerpt"]] = excerpt(key, b, a, problems)
        rows[key] = row
        violations += [f"{up.name} {key}: {p}" for p in problems]
    # A gate without FAIL_TO_PASS tests cannot tell the fix from the base.
    if not any(r["contract"] == "FAIL_TO_PASS" for k, r in rows.items() if not k.startswith(up.upstream_prefix)):
        violations.append(f"{up.name}: no FAIL_TO_PASS test in the kit's suite (no test marked `regression` ran)")
    if up.upstream_tests and not up.fail_to_pass and not up.skipped:
        violations.append(f"{up.name}: no FAIL_TO_PASS upstream test declared in [{up.name}.gate]")
    return rows, violations, excerpts


def summary_of(up: Upstream, rows: dict, violations: list[str]) -> dict:
    """The report.json entry of one upstream (see ``report``)."""
    return {"version": up.version, "base": up.base, "check": up.check, "reason": up.reason,
            "skipped_upstream_tests": up.skipped, "stages": up.stages, "imports": up.imports,
            "FAIL_TO_PASS": [k for k, r in rows.items() if r["contract"] == "FAIL_TO_PASS"],
            "PASS_TO_PASS": [k for k, r in rows.items() if r["contract"] == "PASS_TO_PASS"],
            "tests": rows, "violations": violations, "verdict": "fail" if violations else "pass"}


def report(ups: list[Upstream], meta: dict) -> tuple[dict, str, dict[str, str]]:
    """Judge every upstream; return (report.json document, report.md text, excerpts {path: text}).

    ``meta``: {"wall_s", "versions": {"python", "torch", "torchdata", "numpy"}, "series": {"kit_commit",
    "uncommitted": [paths]}, "jobs"}, recorded as they are.
    """
    doc = {**meta, "python": meta.get("versions", {}).get("python", ""), "upstreams": {}}
    excerpts = {}
    for up in ups:
        rows, violations, found = judge(up)
        doc["upstreams"][up.name] = summary_of(up, rows, violations)
        excerpts |= found
    doc["verdict"] = "fail" if any(u["violations"] for u in doc["upstreams"].values()) else "pass"
    return doc, markdown(doc), excerpts


def cell(text: str, limit: int = 160) -> str:
    """``text`` on one line for a Markdown table cell: pipes escaped, cut to ``limit`` characters."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


STAGE_TEXT = {"series": ("the base {base} + only the series' test hunks", "the base + the series (`git am`)"),
              "fix": ("the base {base} + the series' test files that apply", "that + the series' fix hunks (not its "
                      "other test hunks)")}


def upstream_markdown(name: str, u: dict) -> list[str]:
    """The section of one upstream: stages, imports, violations, then every test collapsed."""
    before, after = STAGE_TEXT[u["check"]]
    stages = u["stages"]
    md = [f"## {name} {u['version']}", ""]
    commits = {s: stages.get(s, {}).get("commit", "")[:12] or "-" for s in ("before", "after")}
    md.append(f"before = `{commits['before']}`: {before.format(base='`' + u['base'][:12] + '`')}; after = "
              f"`{commits['after']}`: {after}. Each stage ran in its own work tree with the tree first on "
              f"`PYTHONPATH`; kit tests are `tests/{name}/...`, upstream tests `upstream/{name}/...` (their path in "
              "the upstream's tree).")
    if u["check"] == "fix":
        md += ["", f"Declared check for this release: **fix only** ({u['reason'] or 'no reason given'})."]
        if u["skipped_upstream_tests"]:
            md.append("Upstream test files skipped (their hunks do not apply): "
                      + ", ".join(f"`{path}`" for path in u["skipped_upstream_tests"]) + ".")
    times = [f"{s} {stages[s]['wall_s']} s" for s in ("before", "after") if "wall_s" in stages.get(s, {})]
    if times:
        md += ["", "Stage wall times: " + ", ".join(times) + "."]
    if u["imports"]:
        counts = "; ".join(f"{stage}: {seen.get('modules', 0)} modules in {seen.get('processes', 0)} processes"
                           for stage, seen in u["imports"].items())
        outside = [module for seen in u["imports"].values() for module in seen.get("outside", [])]
        md.append(f"`{name}` imported ({counts}): " + ("every module from the stage's own work tree." if not outside
                  else "**also from outside it**: " + ", ".join(f"`{m}`" for m in outside[:5])))
    if u["violations"]:
        md += ["", "Violations:", ""]
        links = {key: r["excerpt"] for key, r in u["tests"].items() if "excerpt" in r}
        for violation in u["violations"]:
            key = next((k for k in links if violation.startswith(f"{name} {k}: ")), None)
            md.append(f"- {cell(violation, 300)}" + (f" ([log excerpt]({links[key]}))" if key else ""))
    rows = u["tests"]
    md += ["", f"<details><summary>All {len(rows)} tests: FAIL_TO_PASS first, with the first line of each one's "
           "assertion message before the series</summary>", "",
           "| test | contract | before | after | ok |", "|---|---|---|---|---|"]
    for key, r in rows.items():
        before_cell = f"{r['before']}: {cell(r['reason'])}" if r.get("reason") else r["before"]
        ok = "yes" if r["ok"] else (f"[**no**]({r['excerpt']})" if "excerpt" in r else "**no**")
        md.append(f"| `{key}` | {r['contract']} | {before_cell} | {r['after']} | {ok} |")
    md += ["", "</details>", ""]
    return md


def markdown(doc: dict) -> str:
    """The report.md of a report.json document: the summary per upstream first, then each upstream's section."""
    versions = ", ".join(f"{k} {v}" for k, v in doc.get("versions", {}).items())
    series = doc.get("series", {})
    uncommitted = series.get("uncommitted") or []
    md = ["# Gate report", "",
          f"Verdict: **{doc['verdict'].upper()}** (wall time {doc.get('wall_s', '-')} s; environment: {versions}).",
          "",
          "The series judged are the files of `patches/<name>/` in the kit (commit "
          f"`{series.get('kit_commit', '')[:12] or 'unknown'}`"
          + (f", with uncommitted changes to {', '.join(f'`{p}`' for p in uncommitted)}" if uncommitted else "")
          + "), whatever the checkouts under `upstream/` hold: the gate does not use or change them.", "",
          "| upstream | version | base | check | FAIL_TO_PASS | PASS_TO_PASS | violations | verdict |",
          "|---|---|---|---|---|---|---|---|"]
    for name, u in doc["upstreams"].items():
        md.append(f"| {name} | {u['version']} | `{u['base'][:12]}` | {u['check']} | {len(u['FAIL_TO_PASS'])} | "
                  f"{len(u['PASS_TO_PASS'])} | {len(u['violations'])} | {'**FAIL**' if u['violations'] else 'pass'} |")
    md.append("")
    for name, u in doc["upstreams"].items():
        md += upstream_markdown(name, u)
    return "\n".join(md) + "\n"
