"""The gate's report: report.json's document and report.md from the judged upstreams (grading.py), the environment
and the series' source recorded in it, the console's summary, and the PR bodies a report makes stale.

Pure functions of the judged results, apart from reading the last ``make flows`` reports, the venv's versions and
the kit's git status that the report records.
"""

import contextlib
import json
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

from scripts import plural, sources
from scripts.gate.grading import Upstream, judge, summary_of, unexplained
from scripts.git import git
from scripts.outdated import release_sentence

ENVIRONMENT = ("torch", "torchdata", "numpy")  # versions recorded beside Python's


def build(ups: list[Upstream], meta: dict) -> tuple[dict, str, dict[str, str]]:
    """Judge every upstream; return (report.json document, report.md text, excerpts {path: text}).

    ``meta``: {"wall_s", "versions": {"python", "torch", "torchdata", "numpy"}, "series": {"kit_commit",
    "uncommitted": [paths]}, "jobs", "releases": {name: scripts/outdated.release_status}}, recorded as they are.
    """
    doc = {**meta, "python": meta.get("versions", {}).get("python", ""), "upstreams": {}}
    excerpts = {}
    for up in ups:
        judged, violations, found = judge(up)
        doc["upstreams"][up.name] = summary_of(up, judged, violations)
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


def tests_table(rows: dict, change: str) -> list[str]:
    """Every test of a step, collapsed: FAIL_TO_PASS first, with the first line of its assertion message before."""
    md = ["", f"<details><summary>All {len(rows)} tests: FAIL_TO_PASS first, with the first line of each one's "
          f"assertion message before {change}</summary>", "",
          "| test | contract | before | after | ok |", "|---|---|---|---|---|"]
    for key, r in rows.items():
        before_cell = f"{r['before']}: {cell(r['reason'])}" if r.get("reason") else r["before"]
        ok = "yes" if r["ok"] else (f"[**no**]({r['excerpt']})" if "excerpt" in r else "**no**")
        ok = "not a guard (failed after the commit before)" if r.get("carried") else ok
        md.append(f"| `{key}` | {r['contract']} | {before_cell} | {r['after']} | {ok} |")
    return md + ["", "</details>", ""]


def violation_lines(violations: list[str], rows: dict, label: str) -> list[str]:
    """The violations as a list, each linked to its test's log excerpt when it has one."""
    links = {key: r["excerpt"] for key, r in rows.items() if "excerpt" in r}
    md = ["", "Violations:", ""]
    for violation in violations:
        key = next((k for k in links if violation.startswith(f"{label} {k}: ")), None)
        md.append(f"- {cell(violation, 300)}" + (f" ([log excerpt]({links[key]}))" if key else ""))
    return md


def imports_line(name: str, u: dict) -> list[str]:
    """Where each stage imported the upstream's package from."""
    if not u["imports"]:
        return []
    counts = "; ".join(f"{stage}: {seen.get('modules', 0)} modules in {seen.get('processes', 0)} processes"
                       for stage, seen in u["imports"].items())
    outside = [module for seen in u["imports"].values() for module in seen.get("outside", [])]
    return [f"`{name}` imported ({counts}): " + ("every module from the stage's own work tree." if not outside
            else "**also from outside it**: " + ", ".join(f"`{m}`" for m in outside[:5]))]


def unexplained_line(u: dict) -> list[str]:
    """A note naming the FAIL_TO_PASS tests whose failure before is a bare ``assert`` (unexplained)."""
    found = unexplained(u)
    if not found:
        return []
    return [f"{plural(len(found), 'FAIL_TO_PASS test')} {'fails' if len(found) == 1 else 'fail'} before with a bare "
            "`assert` (pytest's rendering of the values, no sentence of the test's own saying what went wrong): "
            + ", ".join(f"`{k}`" for k in found)]


def series_line(name: str, u: dict) -> str:
    """The id of the series judged, and where it is recorded after a check against the default branch."""
    return (f"Series id `{u.get('series_id', '')}`: after checking this series against {name}'s default branch, "
            f"record it as `series` in `[{name}.default_branch]` of `upstream/sources.toml` (`make pr` calls a check "
            "of another series stale).")


def upstream_markdown(name: str, u: dict) -> list[str]:
    """The section of one upstream: stages, imports, violations, then every test collapsed (a stack: a section
    per commit after the upstream's own lines)."""
    if "steps" in u:
        return stack_markdown(name, u)
    before, after = STAGE_TEXT[u["check"]]
    stages = u["stages"]
    names = list(stages) or ["before", "after"]
    md = [f"## {name} {u['version']}", ""]
    commits = {role: stages.get(s, {}).get("commit", "")[:12] or "-"
               for role, s in zip(("before", "after"), names, strict=False)}
    md += [series_line(name, u), ""]
    md.append(f"before = `{commits['before']}`: {before.format(base='`' + u['base'][:12] + '`')}; after = "
              f"`{commits['after']}`: {after}. Each stage ran in its own work tree with the tree first on "
              f"`PYTHONPATH`; kit tests are `tests/{name}/...`, upstream tests `upstream/{name}/...` (their path in "
              "the upstream's tree).")
    if u["check"] == "fix":
        md += ["", f"Declared check for this release: **fix only** ({u['reason'] or 'no reason given'})."]
        if u["skipped_upstream_tests"]:
            md.append("Upstream test files skipped (their hunks do not apply): "
                      + ", ".join(f"`{path}`" for path in u["skipped_upstream_tests"]) + ".")
    md += ["", *imports_line(name, u), *not_run_line(name, u), *unexplained_line(u)]
    if u["violations"]:
        md += violation_lines(u["violations"], u["tests"], name)
    return md + tests_table(u["tests"], "the series")


def not_run_line(name: str, u: dict) -> list[str]:
    """The upstream tests the gate deselected (``not_run`` of ``[<name>.gate]``), each with why; none: no line."""
    reasons = u.get("not_run") or {}
    return [f"Not run here (deselected, `not_run` in `[{name}.gate]`): "
            + "; ".join(f"`{test}` ({why})" for test, why in reasons.items()) + ".", ""] if reasons else []


def stack_markdown(name: str, u: dict) -> list[str]:
    """The section of a stack: its stages and imports, the violations outside any commit, then one section per
    commit (subject, stages, its FAIL_TO_PASS with the first assertion line before, the guards it kept green)."""
    stages, n = u["stages"], len(u["steps"])
    md = [f"## {name} {u['version']}: a stack of {n} commits", "", series_line(name, u), "",
          f"Commit k is judged on *before k* = the base `{u['base'][:12]}` + commits 1..k-1 + only commit k's test "
          "hunks, and *after k* = the base + commits 1..k (`git am`): its FAIL_TO_PASS tests (its declared upstream "
          "tests and the kit's tests marked with its key) fail with an assertion before and pass after; every other "
          "test of both stages (the earlier commits' included) passes in both. Each stage ran in its own work tree "
          f"with the tree first on `PYTHONPATH`; kit tests are `tests/{name}/...`, upstream tests "
          f"`upstream/{name}/...`.",
          "", *imports_line(name, u), *not_run_line(name, u), *unexplained_line(u)]
    own = {v for step in u["steps"] for v in step["violations"]}
    outside = [v for v in u["violations"] if v not in own]
    if outside:
        md += violation_lines(outside, {}, name)
    for step in u["steps"]:
        k, rows = step["commit"], step["tests"]
        label = f"{name} {k}/{n}"
        f2p = [key for key in step["FAIL_TO_PASS"]]
        guards = step["PASS_TO_PASS"]
        earlier = [key for key in guards if any(key in s["FAIL_TO_PASS"] for s in u["steps"][:k - 1])]
        commit = {role: stages.get(step["stages"][role], {}).get("commit", "")[:12] or "-" for role in ("before",
                                                                                                         "after")}
        md += ["", f"### {k}/{n}: {step['subject']} ({'**FAIL**' if step['violations'] else 'pass'})", "",
               f"`{step['patch']}`, key `{step['key']}`. before {k} = stage `{step['stages']['before']}` "
               f"(`{commit['before']}`), after {k} = stage `{step['stages']['after']}` (`{commit['after']}`).", "",
               f"FAIL_TO_PASS ({len(f2p)}), with the first line of each one's assertion message before commit {k}:",
               ""]
        md += [f"- `{key}`: {cell(rows[key].get('reason', rows[key]['before']), 300)}" for key in f2p]
        carried = [key for key in guards if rows[key].get("carried")]
        guards = [key for key in guards if key not in carried]
        kept = sum(rows[key]["ok"] for key in guards)
        md += ["", f"Guards kept green (PASS_TO_PASS): {kept} of {len(guards)}"
               + (f", {len(earlier)} of them the FAIL_TO_PASS tests of commits 1..{k - 1}." if k > 1 else ".")]
        if carried:
            md.append(f"Not guards here: {len(carried)} tests that did not pass after commit {k - 1} (its section "
                      "says why): " + ", ".join(f"`{key}`" for key in carried[:5])
                      + ("..." if len(carried) > 5 else ""))
        if step["violations"]:
            md += violation_lines(step["violations"], rows, label)
        md += tests_table(rows, f"commit {k}")
    return md


def stages_markdown(doc: dict) -> list[str]:
    """The stages once: what each held per upstream, whether it ran in this run or its results were reused (from
    which run; scripts/gate/cache.py), its wall and CPU time, and links to its pytest log and results."""
    rows: dict[str, list[dict]] = {}
    for name, u in doc["upstreams"].items():
        for stage, entry in u["stages"].items():
            rows.setdefault(stage, []).append({"name": name, **entry})
    if not rows:
        return []
    md = ["| stage | holds | ran or reused | wall (s) | CPU (s) | log | results |", "|---|---|---|---|---|---|---|"]
    for stage, entries in rows.items():
        holds = "; ".join(f"{e['name']}: {e.get('holds', '')}" + (f" (kit suite: the results of {e['kit_results_of']})"
                                                                  if "kit_results_of" in e else "") for e in entries)
        how = "; ".join(f"{e['name']}: " + (f"reused from the run of {e['reused']}" if e.get("reused") else "ran")
                        for e in entries)
        logs = list(dict.fromkeys((e.get("log", f"{stage}/pytest.log"), e.get("junit", f"{stage}/junit.xml"))
                                  for e in entries))
        first = entries[0]
        md.append(f"| {stage} | {holds} | {how} | {first.get('wall_s', '-')} | {first.get('cpu_s') or '-'} "
                  f"| {' '.join(f'[pytest.log]({log})' for log, _ in logs)} "
                  f"| {' '.join(f'[{Path(junit).name}]({junit})' for _, junit in logs)} |")
    return [*md, ""]


def releases_lines(doc: dict) -> list[str]:
    """Whether each base is the newest release, from the last ``make outdated`` (``doc["releases"]``, issue 30)."""
    releases = doc.get("releases", {})
    sentences = [release_sentence(name, u["version"], releases[name]) for name, u in doc["upstreams"].items()
                 if name in releases]
    return [" ".join(sentences), ""] if sentences else []


def markdown(doc: dict) -> str:
    """The report.md of a report.json document: the summary (a row per upstream, per commit of a stack), the
    stages, then each upstream's section."""
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
          *releases_lines(doc),
          "| upstream | version | base | check | FAIL_TO_PASS | PASS_TO_PASS | violations | verdict |",
          "|---|---|---|---|---|---|---|---|"]
    for name, u in doc["upstreams"].items():
        rows = [(s, f"{name} {s['commit']}/{s['of']}") for s in u.get("steps", [])] or [(u, name)]
        outside = [v for v in u["violations"] if not any(v in s["violations"] for s in u.get("steps", [u]))]
        if outside:  # of a stack: a series that does not apply, a module imported from elsewhere, a stray key
            rows.append(({"FAIL_TO_PASS": [], "PASS_TO_PASS": [], "violations": outside}, f"{name} (the stack)"))
        for row, what in rows:
            md.append(f"| {what} | {u['version']} | `{u['base'][:12]}` | {u['check']} | {len(row['FAIL_TO_PASS'])} | "
                      f"{len(row['PASS_TO_PASS'])} | {len(row['violations'])} | "
                      f"{'**FAIL**' if row['violations'] else 'pass'} |")
    md += ["", *flows_lines(doc), *stages_markdown(doc)]
    for name, u in doc["upstreams"].items():
        md += upstream_markdown(name, u)
    return "\n".join(md) + "\n"


def flows_lines(doc: dict) -> list[str]:
    """The flow table's summary per upstream (``doc["flows"]``: the last ``make flows`` report's summary ``lines``,
    ``selection`` and ``series_id`` per upstream), when it ran the series judged here; else that none is on record.
    The lines are those ``build/flows/<name>.md`` and ``make pr`` show, one per kind of flow."""
    md = []
    for name, u in doc["upstreams"].items():
        flows = (doc.get("flows") or {}).get(name)
        if not flows or flows.get("series_id") != u.get("series_id") or flows.get("uncommitted"):
            md.append(f"- {name}: no flow table of this series is on record (`make flows`).")
        elif not flows.get("lines"):
            md.append(f"- {name}: the flow table of this series on record has no summary per kind of flow: run "
                      "`make flows` (or `python -m scripts.flows --render`).")
        else:
            md.append(f"- {name}: the flow table ({flows['selection']}; `build/flows/{name}.md`):")
            md += [f"  - {line}" for line in flows["lines"]]
    return [*md, ""] if md else []


def unfinished_markdown(why: str, wall_s: float, logs: list[str]) -> str:
    """The report.md of a gate run that ended without a verdict: ``why`` (interrupted, or the error), after
    ``wall_s`` seconds; ``logs``: the stages' logs it left (paths relative to the report)."""
    kept = (" What this run's stages logged before it ended: " + ", ".join(f"[{path}]({path})" for path in logs) + "."
            if logs else "")
    return ("# Gate report\n\n"
            f"Verdict: **none**: this run ended after {wall_s} s without judging the series ({cell(why, 300)}). The "
            "previous run's report was removed with its evidence (stage logs, JUnit XML, excerpts) when this run "
            f"started.{kept} Run `make gate` again for a verdict.\n")


def flows_records(folder: Path = sources.KIT_ROOT / "build" / "flows") -> dict:
    """{name: the ``summary``, summary ``lines``, ``selection`` and ``series_id`` of the last ``make flows`` report of
    each upstream} (an unreadable or missing report: left out); the report cites them when they are of the series it
    judges."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            doc = json.loads(path.read_text())
            keys = ("summary", "lines", "selection", "series_id", "uncommitted")
            found[doc["upstream"]] = {key: doc.get(key) for key in keys}
    return found


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


def remove_stale_bodies(doc: dict, pr_dir: Path) -> None:
    """Remove the PR bodies ``pr_dir/<name>/`` that ``make pr`` made from another series than the one this report
    judged (their ``.series`` file holds another series id), and bodies of the old one-file layout."""
    for name, entry in doc["upstreams"].items():
        stamp = pr_dir / name / ".series"
        legacy = pr_dir / f"{name}.md"
        stale = stamp.exists() and stamp.read_text().strip() != entry["series_id"]
        if legacy.exists() or stale:  # a body of the one-file layout names no series: it is stale
            legacy.unlink(missing_ok=True)
            if stale:
                shutil.rmtree(pr_dir / name, ignore_errors=True)
            print(f"gate: removed the PR bodies of {name} in {os.path.relpath(pr_dir)}/, made from another series: "
                  "run `make pr` again", flush=True)


def summary_lines(doc: dict) -> list[str]:
    """The console's summary of a report: how many stages ran and how many were reused, then per upstream its counts
    (a stack: the commits' own, which its report's summary table shows, and the FAIL_TO_PASS of all commits), then
    each violation."""
    stages = [entry for u in doc["upstreams"].values() for entry in u["stages"].values()]
    reused = sum(bool(entry.get("reused")) for entry in stages)
    lines = [f"  stages of the upstreams: {len(stages) - reused} ran, {reused} reused their stored results"
             + (" (GATE_CACHE=0 runs them all)" if reused else "")]
    for name, entry in doc["upstreams"].items():
        steps = entry.get("steps", [])
        if steps:
            lines.append(f"  {name} {entry['version']} ({entry['check']}), a stack of {len(steps)} commits: "
                         f"FAIL_TO_PASS {len(entry['FAIL_TO_PASS'])} in all, violations {len(entry['violations'])}; "
                         f"series id {entry['series_id']}")
        else:
            lines.append(f"  {name} {entry['version']} ({entry['check']}): FAIL_TO_PASS "
                         f"{len(entry['FAIL_TO_PASS'])}, PASS_TO_PASS {len(entry['PASS_TO_PASS'])}, violations "
                         f"{len(entry['violations'])}; series id {entry['series_id']}")
        lines += [f"    {step['commit']}/{step['of']} {step['subject']}: FAIL_TO_PASS {len(step['FAIL_TO_PASS'])}, "
                  f"PASS_TO_PASS {len(step['PASS_TO_PASS'])}, violations {len(step['violations'])}" for step in steps]
        lines += [f"  violation: {violation}" for violation in entry["violations"]]
    return lines
