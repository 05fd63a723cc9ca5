"""Write the pull-request bodies ``build/pr/<name>.md`` from ``docs/pr/<name>.md`` and the gate's report.

The prose of each body is written by people in ``docs/pr/<name>.md``; this fills its placeholders:

- ``{gate}``: the base (the release tag, and whether and when the series was checked against the upstream's
  default branch: ``[<name>.default_branch]`` of upstream/sources.toml), then the count sentence (the PR's new
  tests that fail before and pass after, its new tests that pass in both stages, and the upstream's existing tests
  that pass in both), and one row per FAIL_TO_PASS test of the PR, from ``build/gate/report.json``;
- ``{reproduce}``: the commands, with a link to the kit: ``KIT_URL`` from the environment, else the URL of the
  kit's git remote ``origin`` (``git remote get-url origin``); a local path is not a usable link.

Every body is checked before any is written (both bodies or none): the report exists, has no violation for
that upstream, and its *after* stage tested the tree of the checkout's HEAD; the kit's URL is usable. Raises
KitError (exit 1, one line) otherwise. A test is *new* when its function is a ``def test_...`` that the series
adds (``+`` lines of ``patches/<name>/``), found as the longest such name that the test's name starts with.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

from scripts import KitError, plural, runlock, series, sources
from scripts.git import git
from scripts.lint import placeholder_notes

URL = re.compile(r"^(https?://|ssh://|git@)[^\s]+$")


def kit_url(environ: dict, root: Path = sources.KIT_ROOT) -> str:
    """The kit's public URL: ``KIT_URL``, else ``git remote get-url origin`` (``git@host:a/b.git`` as https).

    Raises KitError when neither gives a URL (a local path, no remote).
    """
    url = environ.get("KIT_URL", "").strip()
    origin = git(root, "remote", "get-url", "origin", check=False).stdout.strip() if (root / ".git").exists() else ""
    url = url or origin
    found = re.match(r"^git@([^:]+):(.+?)(\.git)?$", url)
    url = f"https://{found.group(1)}/{found.group(2)}" if found else url.removesuffix(".git")
    if not URL.match(url):
        raise KitError(f"the PR bodies link the kit, but KIT_URL is unset and origin is {origin or 'not set'}, not a "
                       f"public URL: run `make pr KIT_URL=https://github.com/<you>/<kit>`")
    return url


def added_tests(patch_dir: Path) -> dict[str, set[str]]:
    """{file: names of the ``test_*`` functions the series adds to it}, from the ``+`` lines of the patches."""
    added: dict[str, set[str]] = {}
    for patch in series.patch_files(patch_dir):
        file = ""
        for line in patch.read_text(errors="replace").splitlines():
            if line.startswith("+++ "):
                file = line[6:] if line.startswith("+++ b/") else ""
            found = re.match(r"^\+\s*def (test_\w+)\(", line)
            if found and file:
                added.setdefault(file, set()).add(found.group(1))
    return added


def is_new(key: str, added: dict[str, set[str]], defined: dict[str, set[str]]) -> bool:
    """True when the upstream test ``file::...::name[params]`` runs a function the series adds.

    ``defined``: {file: every ``def test_*`` name in the file after the series}; the longest name that the test's
    name equals or starts with (``name_...``, as parameterized.expand names them) is the test's function.
    """
    file, name = key.split("::")[0], re.sub(r"\[.*\]$", "", key.split("::")[-1])
    functions = [d for d in defined.get(file, ()) if name == d or name.startswith(d + "_")]
    return bool(functions) and max(functions, key=len) in added.get(file, set())


def base_sentence(name: str, entry: dict, table: dict) -> str:
    """Markdown: the base is the release tag; whether and when the series was checked on the default branch."""
    tag = table.get("tag", "v{version}").format(version=entry["version"])
    text = (f"Base: the release tag `{tag}` ({name} {entry['version']}; the kit builds it from the release's PyPI "
            f"sdist, pinned by sha256, or with `SOURCE=git` takes the tag itself).")
    checked = table.get("default_branch")
    if not checked:
        return text + " The series was not checked against the default branch."
    how = "applies" if checked["applies"] else "does NOT apply"
    return (text + f" The series also {how} to the default branch `{checked['branch']}` as of commit "
            f"`{checked['commit'][:12]}` (committed {checked['committed']}; checked {checked['checked']} with "
            f"{checked['how']}).")


def verb(n: int, one: str, many: str) -> str:
    """The verb form that goes with ``n`` subjects."""
    return one if n == 1 else many


def gate_section(name: str, entry: dict, table: dict, patch_dir: Path, defined: dict[str, set[str]]) -> str:
    """Markdown: the base, the count sentence (new vs existing tests), one row per FAIL_TO_PASS test of the PR."""
    tests, prefix = entry["tests"], f"upstream/{name}/"
    added = added_tests(patch_dir)
    own = [key for key in entry["FAIL_TO_PASS"] if key.startswith(prefix)]
    kit = [key for key in entry["FAIL_TO_PASS"] if not key.startswith(prefix)]
    guards = [key for key in entry["PASS_TO_PASS"] if key.startswith(prefix)]
    new_guards = [key for key in guards if is_new(key.removeprefix(prefix), added, defined)]
    files = sorted({key.removeprefix(prefix).split("::")[0] for key in guards if key not in new_guards})
    old = len(guards) - len(new_guards)
    existing = (f"{plural(old, 'existing test')} of {', '.join(f'`{f}`' for f in files)} (already in the release) "
                f"{verb(old, 'passes', 'pass')} in both stages" if files else "no existing upstream test runs")
    lines = [base_sentence(name, entry, table), "",
             f"*Before* = the release + only the tests of this PR, *after* = the release + this PR. "
             f"{plural(len(own), 'new test')} of this PR {verb(len(own), 'fails', 'fail')} before and "
             f"{verb(len(own), 'passes', 'pass')} after; {plural(len(new_guards), 'new test')} of this PR "
             f"{verb(len(new_guards), 'passes', 'pass')} in both stages; {existing}; "
             f"violations: {len(entry['violations'])}.", "",
             "| test | before | after |", "|---|---|---|"]
    lines += [f"| `{key.removeprefix(prefix)}` | {tests[key]['before']} | {tests[key]['after']} |" for key in own]
    lines += ["", f"The contribution kit's own regression suite for this bug adds {len(kit)} FAIL_TO_PASS and "
              f"{len(entry['PASS_TO_PASS']) - len(guards)} PASS_TO_PASS tests, with the same verdict."]
    return "\n".join(lines)


def reproduce_section(name: str, entry: dict, upstream_tests: list[str], url: str) -> str:
    """Markdown: the commands that reproduce the table, with the kit (linked) and in a plain upstream checkout."""
    pytest_line = f"python -m pytest {' '.join(upstream_tests)}"
    folder = url.rstrip("/").rsplit("/", 1)[-1]
    return "\n".join([
        f"With the contribution kit, {url} (Python 3.11, CPU only; it fetches the release itself):", "", "```",
        f"git clone {url} && cd {folder}",
        f"make apply {name.upper()}_VERSION={entry['version']}",
        f"make gate {name.upper()}_VERSION={entry['version']}   # report in build/gate/report.md", "```", "",
        "In an upstream checkout with this PR (and without it, to see the failures):", "", "```", pytest_line, "```"])


def rev_tree(repo: Path) -> str:
    """The tree id of HEAD: what the gate's *after* stage must have tested (its commit may be another one)."""
    return git(repo, "rev-parse", "HEAD^{tree}").stdout.strip()


def defined_tests(repo: Path, commit: str, files: set[str]) -> dict[str, set[str]]:
    """{file: ``def test_*`` names in ``files`` at ``commit`` of ``repo``} (a file missing there: no names)."""
    found = {}
    for file in files:
        text = git(repo, "show", f"{commit}:{file}", check=False).stdout
        found[file] = set(re.findall(r"^\s*def (test_\w+)\(", text, re.M))
    return found


def bodies(docs: Path, report_file: Path, checkouts: Path, patches: Path, pins: Path, url: str) -> dict[str, str]:
    """{name: the filled body} for every template in ``docs``; raise KitError (nothing written) on any problem."""
    if not report_file.exists():
        raise KitError(f"{report_file} is missing: run `make gate` first")
    report = json.loads(report_file.read_text())
    table = sources.load(pins)
    made = {}
    for template in sorted(docs.glob("*.md")):
        name = template.stem
        entry = report["upstreams"].get(name)
        if entry is None or entry["violations"]:
            raise KitError(f"the gate report has no clean result for {name}: run `make gate` and fix it first")
        repo, after = checkouts / name, entry["stages"]["after"]["commit"]
        tree = git(repo, "rev-parse", "--verify", "--quiet", f"{after}^{{tree}}", check=False).stdout.strip()
        if tree != rev_tree(repo):
            raise KitError(f"the gate report was made from another tree of {name} than HEAD's: run `make gate` again")
        prefix = f"upstream/{name}/"
        files = {key.removeprefix(prefix).split("::")[0] for key in entry["tests"] if key.startswith(prefix)}
        gate = gate_section(name, entry, table[name], patches / name, defined_tests(repo, after, files))
        reproduce = reproduce_section(name, entry, table[name].get("gate", {}).get("upstream_tests", []), url)
        made[name] = template.read_text().replace("{gate}", gate).replace("{reproduce}", reproduce)
    return made


def main(argv: list[str] | None = None) -> int:
    """Write one body per upstream that has a template (all or none); return 0, or 1 with one line on a KitError."""
    parser = argparse.ArgumentParser(prog="python -m scripts.pr", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=sources.KIT_ROOT / "docs" / "pr")
    parser.add_argument("--report", type=Path, default=sources.KIT_ROOT / "build" / "gate" / "report.json")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "pr")
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--root", type=Path, default=sources.KIT_ROOT, help="the kit's clone (its origin: KIT_URL)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> int:
        try:
            url = kit_url(os.environ, args.root)
            made = bodies(args.docs, args.report, args.checkouts, args.patches, args.sources, url)
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        for name, body in made.items():
            (args.out / f"{name}.md").write_text(body)
            print(f"pr: wrote {args.out / f'{name}.md'}")
            for note in placeholder_notes(args.patches / name):
                print(f"  {note}")
        return 0

    return runlock.interruptible(work, lambda: runlock.describe_checkouts(args.checkouts, args.patches, args.sources))


if __name__ == "__main__":
    sys.exit(main())
