"""Write the pull-request bodies ``build/pr/<name>.md`` from ``docs/pr/<name>.md`` and the gate's report.

The prose of each body is written by people in ``docs/pr/<name>.md``; this fills its ``{gate}`` placeholder
with the FAIL_TO_PASS / PASS_TO_PASS table of ``build/gate/report.json`` (so ``make gate`` must have run on
the current series) and ``{reproduce}`` with the exact commands. Raises KitError (exit 1, one line) when the
report is missing, failed, or was made from another series than the one in ``patches/<name>/``.
"""

import json
import sys

from scripts import KitError, sources
from scripts.checkout import rev
from scripts.lint import placeholder_notes

DOCS = sources.KIT_ROOT / "docs" / "pr"
REPORT = sources.KIT_ROOT / "build" / "gate" / "report.json"
OUT = sources.KIT_ROOT / "build" / "pr"


def gate_section(name: str, entry: dict) -> str:
    """Markdown: one row per FAIL_TO_PASS test of the PR's own tests, PASS_TO_PASS counted, kit tests summarized."""
    tests, prefix = entry["tests"], f"upstream/{name}/"
    own = [key for key in entry["FAIL_TO_PASS"] if key.startswith(prefix)]
    kit = [key for key in entry["FAIL_TO_PASS"] if not key.startswith(prefix)]
    guards = [key for key in entry["PASS_TO_PASS"] if key.startswith(prefix)]
    lines = [f"{name} {entry['version']}: *before* = the release + only the tests of this PR, *after* = the release "
             f"+ this PR. {len(own)} tests of this PR fail before and pass after; {len(guards)} other tests of the "
             f"files run pass in both; violations: {len(entry['violations'])}.", "",
             "| test | before | after |", "|---|---|---|"]
    lines += [f"| `{key.removeprefix(prefix)}` | {tests[key]['before']} | {tests[key]['after']} |" for key in own]
    lines += ["", f"The contribution kit's own regression suite for this bug adds {len(kit)} FAIL_TO_PASS and "
              f"{len(entry['PASS_TO_PASS']) - len(guards)} PASS_TO_PASS tests, with the same verdict."]
    return "\n".join(lines)


def reproduce_section(name: str, entry: dict, upstream_tests: list[str]) -> str:
    """Markdown: the commands that reproduce the table, with the kit and in a plain upstream checkout."""
    pytest_line = f"python -m pytest {' '.join(upstream_tests)}"
    return "\n".join([
        "With the contribution kit (Python 3.11, CPU only):", "", "```",
        f"make apply {name.upper()}_VERSION={entry['version']}",
        f"make gate {name.upper()}_VERSION={entry['version']}   # report in build/gate/report.md", "```", "",
        "In an upstream checkout with this PR (and without it, to see the failures):", "", "```", pytest_line, "```"])


def main() -> int:
    """Write one body per upstream that has a template; return 0, or 1 with one line on a KitError."""
    try:
        if not REPORT.exists():
            raise KitError(f"{REPORT} is missing: run `make gate` first")
        report = json.loads(REPORT.read_text())
        table = sources.load()
        OUT.mkdir(parents=True, exist_ok=True)
        for template in sorted(DOCS.glob("*.md")):
            name = template.stem
            entry = report["upstreams"].get(name)
            if entry is None or entry["violations"]:
                raise KitError(f"the gate report has no clean result for {name}: run `make gate` and fix it first")
            head = rev(sources.KIT_ROOT / "upstream" / name)
            if entry["stages"]["after"]["commit"] != head:
                raise KitError(f"the gate report is for another commit of {name} than HEAD: run `make gate` again")
            body = template.read_text().replace("{gate}", gate_section(name, entry)).replace(
                "{reproduce}", reproduce_section(name, entry, table[name].get("gate", {}).get("upstream_tests", [])))
            (OUT / f"{name}.md").write_text(body)
            print(f"pr: wrote {OUT / f'{name}.md'}")
            for note in placeholder_notes(sources.KIT_ROOT / "patches" / name):
                print(f"  {note}")
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
