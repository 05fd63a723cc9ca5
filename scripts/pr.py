"""Write the pull-request bodies ``build/pr/<name>/<n>-<slug>.md``, one per commit, from ``docs/pr/<name>/<n>.md``
and the results on disk.

The prose of each body is written by people in ``docs/pr/<name>/<n>.md`` (n: the commit's number in
``patches/<name>/``); the claims about what ran come from results on disk, through placeholders:

- ``{gate}``: the base (the release tag, plus the PRs below this one in a stack; whether it is the newest release as
  of the last ``make outdated``, ``build/outdated.json``; and the default-branch check:
  ``[<name>.default_branch]`` of upstream/sources.toml, reported as stale unless its ``series`` is the id of the
  series judged, scripts/stack.series_id, with the snapshot's age relative to the newest release), then the count
  sentence (the PR's new tests that fail before and pass after, its new tests that pass in both stages, and the tests
  already there that pass in both), and one row per FAIL_TO_PASS test of the PR, from ``build/gate/report.json``
  (for a stack: the commit's step);
- ``{reproduce}``: the commands, with a link to the kit: ``KIT_URL`` from the environment, else the URL of the
  kit's git remote ``origin`` (``git remote get-url origin``); a local path is not a usable link;
- ``{matrix}``: one sentence on the last ``make matrix`` (``build/matrix/report.json``): its date, the releases and
  dependency versions it gated and how many rows met their declaration, when it judged this very series; else that
  no matrix result for this series is on record (only the gate's release was checked).

A body whose text still holds a placeholder for an issue number (``Fixes #<the follow-up issue: ...>``: a follow-up
whose bug report, ``docs/issues/<key>.md``, is not filed yet) is refused, naming the report to file, unless
``--draft`` (``make pr DRAFT=1``), which writes the bodies with a warning first and last.

A series of several commits gets the stack at the top of each body, newest first, this PR marked ``__->__`` (as
PyTorch's ghstack heads its PRs). Every body is checked before any is written (all bodies or none): the report
exists, has no violation for that upstream, and its last *after* stage tested the tree of the checkout's HEAD;
there is a template per commit; the kit's URL is usable. Raises KitError (exit 1, one line) otherwise. A test is
*new* when its function is a ``def test_...`` that the PR's commit adds (``+`` lines of its patch), found as the
longest such name that the test's name starts with. ``build/pr/<name>/.series`` records the series id, so that a
later gate of another series removes the bodies (scripts/gate/).
"""

import json
import os
import re
import shutil
import sys
from pathlib import Path

from scripts import ArgumentParser, KitError, outdated, plural, runlock, series, sources, stack
from scripts.git import git, rev
from scripts.lint import placeholder_notes
from scripts.matrix import version_key

URL = re.compile(r"^(https?://|ssh://|git@)[^\s]+$")


def kit_url(environ: dict, root: Path = sources.KIT_ROOT, draft: bool = False) -> str:
    """The kit's public URL: ``KIT_URL``, else ``git remote get-url origin`` (``git@host:a/b.git`` as https).

    Raises KitError when neither gives a URL (a local path, no remote), naming the one that was tried and the command
    to run (with ``DRAFT=1`` for a ``draft``).
    """
    given = environ.get("KIT_URL", "").strip()
    origin = git(root, "remote", "get-url", "origin", check=False).stdout.strip() if (root / ".git").exists() else ""
    url = given or origin
    found = re.match(r"^git@([^:]+):(.+?)(\.git)?$", url)
    url = f"https://{found.group(1)}/{found.group(2)}" if found else url.removesuffix(".git")
    if not URL.match(url):
        what = (f"KIT_URL={given} is not" if given else
                f"KIT_URL is unset and origin is {origin or 'not set'}, not")
        raise KitError(f"the PR bodies link the kit for their reviewers, but {what} a public URL: run "
                       f"`make pr {'DRAFT=1 ' if draft else ''}KIT_URL=https://github.com/<you>/<kit>`")
    return url


# `Fixes #<the follow-up issue: ...>`: an issue not filed yet; its text may hold a `>` (`num_workers > 0`), so it ends
# at a `>` followed by the end of the line or by punctuation.
PLACEHOLDER = re.compile(r"#<[^\n]*?>(?=\s*[(.,;]|\s*$)", re.M)


def placeholders(made: dict[str, dict[str, str]], keys: dict[str, list[str]], issues: Path) -> list[str]:
    """One phrase per body of ``made`` ({name: {file: body}}) that holds a placeholder for an issue number, naming
    the bug report to file first: ``issues/<key>.md`` of the commit's key (``keys``: {name: [key per body]})."""
    found = []
    for name, files in made.items():
        for (file, body), key in zip(files.items(), keys[name], strict=True):
            for text in dict.fromkeys(PLACEHOLDER.findall(body)):
                report = issues / f"{key}.md"
                shown = report.relative_to(sources.KIT_ROOT) if report.is_relative_to(sources.KIT_ROOT) else report
                what = f"file {shown} upstream" if key and report.exists() else "file its bug report upstream"
                found.append(f"{name} {file} says `{text}`: {what}")
    return found


def body_name(number: int, subject: str) -> str:
    """The file name of PR body ``number``: its commit's whole subject as a slug (``2-add-more.md``), not the
    patch file's name, which ``git format-patch`` cuts mid-word."""
    return f"{number}-{re.sub(r'[^a-z0-9]+', '-', subject.lower()).strip('-')}.md"


def is_new(key: str, added: dict[str, set[str]], defined: dict[str, set[str]]) -> bool:
    """True when the upstream test ``file::...::name[params]`` runs a function the series adds.

    ``defined``: {file: every ``def test_*`` name in the file after the series}; the longest name that the test's
    name equals or starts with (``name_...``, as parameterized.expand names them) is the test's function.
    """
    file, name = key.split("::")[0], re.sub(r"\[.*\]$", "", key.split("::")[-1])
    functions = [d for d in defined.get(file, ()) if name == d or name.startswith(d + "_")]
    return bool(functions) and max(functions, key=len) in added.get(file, set())


def base_sentence(name: str, entry: dict, table: dict, below: int, release: dict) -> str:
    """Markdown: the base is the release tag (and the ``below`` PRs under this one), whether it is the newest release
    (``release``: scripts/outdated.release_status of the last ``make outdated``); whether and when the series was
    checked on the default branch, whether that check was of this series, and how old that snapshot is relative to
    the newest release (issue 30)."""
    tag = table.get("tag", "v{version}").format(version=entry["version"])
    text = (f"Base: the release tag `{tag}` ({name} {entry['version']}; the kit builds it from the release's PyPI "
            f"sdist, pinned by sha256, or with `SOURCE=git` takes the tag itself)"
            + (f" + the {plural(below, 'PR')} below this one in the stack." if below else ".")
            + f" {outdated.release_sentence(name, entry['version'], release)}")
    checked = table.get("default_branch")
    if not checked:
        return text + " The series was not checked against the default branch."
    how = "applies" if checked["applies"] else "does NOT apply"
    where = (f"the default branch `{checked['branch']}` as of commit `{checked['commit'][:12]}` (committed "
             f"{checked['committed']}; checked {checked['checked']} with {checked['how']})")
    age = outdated.snapshot_sentence(name, entry["version"], release, checked["committed"])
    if checked.get("series") != entry.get("series_id"):
        return (text + f" A check against {where} is on record, but for another version of the series than this "
                f"one (`{entry.get('series_id', '?')}`): check again before opening the PR; {age}.")
    return text + f" The series also {how} to {where}; {age}."


def verb(n: int, one: str, many: str) -> str:
    """The verb form that goes with ``n`` subjects."""
    return one if n == 1 else many


def gate_section(name: str, entry: dict, step: dict, table: dict, patches: list[Path],
                 defined: dict[str, set[str]], release: dict) -> str:
    """Markdown: the base, the count sentence (new vs existing tests), one row per FAIL_TO_PASS test of the PR.

    ``step``: the entry itself for a series judged as one block, else the commit's step; ``patches``: its patches;
    ``release``: what the last ``make outdated`` says of the base (``base_sentence``).
    """
    tests, prefix = step["tests"], f"upstream/{name}/"
    below = step.get("commit", 1) - 1
    added = stack.added_tests(patches)
    own = [key for key in step["FAIL_TO_PASS"] if key.startswith(prefix)]
    kit = [key for key in step["FAIL_TO_PASS"] if not key.startswith(prefix)]
    guards = [key for key in step["PASS_TO_PASS"] if key.startswith(prefix) and not tests[key].get("carried")]
    new_guards = [key for key in guards if is_new(key.removeprefix(prefix), added, defined)]
    files = sorted({key.removeprefix(prefix).split("::")[0] for key in guards if key not in new_guards})
    old = len(guards) - len(new_guards)
    there = "already in the release" + (" or the PRs below" if below else "")
    existing = (f"{plural(old, 'existing test')} of {', '.join(f'`{f}`' for f in files)} ({there}) "
                f"{verb(old, 'passes', 'pass')} in both stages" if files else "no existing upstream test runs")
    stages = ("*Before* = the release + the PRs below + only the tests of this PR, *after* = that + this PR."
              if below else "*Before* = the release + only the tests of this PR, *after* = the release + this PR.")
    lines = [base_sentence(name, entry, table, below, release), "",
             f"{stages} "
             f"{plural(len(own), 'new test')} of this PR {verb(len(own), 'fails', 'fail')} before and "
             f"{verb(len(own), 'passes', 'pass')} after; {plural(len(new_guards), 'new test')} of this PR "
             f"{verb(len(new_guards), 'passes', 'pass')} in both stages; {existing}; "
             f"violations: {len(step['violations'])}.", "",
             "| test | before | after |", "|---|---|---|"]
    lines += [f"| `{key.removeprefix(prefix)}` | {tests[key]['before']} | {tests[key]['after']} |" for key in own]
    kit_guards = len([k for k in step["PASS_TO_PASS"] if not k.startswith(prefix)])
    lines += ["", f"The contribution kit's own regression suite for this bug adds {len(kit)} FAIL_TO_PASS and "
              f"{kit_guards} PASS_TO_PASS tests, with the same verdict."]
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


def version_order(text: str) -> list:
    """Sort key of a release (``"0.19.6"``) or a dependency (``"torchdata 0.10.1"``): the package name, then the
    release's ``matrix.version_key``, so that 0.9 comes before 0.10."""
    name, _, version = text.rpartition(" ")
    return [name, *version_key(version)]


def matrix_sentence(name: str, entry: dict, matrix_file: Path) -> str:
    """Markdown: what the last ``make matrix`` gated, when it judged this series (``entry["series_id"]``); else
    that no matrix result for this series is on record."""
    only = f"only {name} {entry['version']} was gated (the table above)"
    try:
        doc = json.loads(matrix_file.read_text())
    except (OSError, ValueError):
        return f"No `make matrix` result is on record: {only}."
    if doc.get("series", {}).get(name) != entry.get("series_id"):
        return f"The last `make matrix` ({doc.get('date', 'undated')}) judged another version of this series: {only}."
    rows = [row for row in doc["rows"] if row["upstream"] == name]
    releases = sorted({row["release"] for row in rows}, key=version_order)
    deps = sorted({row["dependency"] for row in rows if row["dependency"]}, key=version_order)
    met = sum(row["meets"] for row in rows)
    failing = [f"{row['release']} {row['dependency']}".strip() for row in rows if not row["meets"]]
    return (f"`make matrix` ({doc.get('date', 'undated')}, torch and the kit's lock) gated this series on {name} "
            f"{', '.join(releases)}" + (f" with {', '.join(deps)}" if deps else "")
            + f": {met} of {len(rows)} runs met their declaration" + (f"; not: {', '.join(failing)}." if failing
                                                                      else "."))


def flows_sentence(name: str, flows_file: Path, head: str) -> str:
    """Markdown: the flow table's summary lines of the last ``make flows`` (``build/flows/<name>.json``), as its report
    and the gate's show them, when it ran the checkout's HEAD ``head``; else that no flow table of this series is on
    record."""
    try:
        doc = json.loads(flows_file.read_text())
    except (OSError, ValueError):
        return "The flow table was not run on this series (`make flows`)."
    if doc.get("series") != head or doc.get("uncommitted"):
        return f"The last `make flows` ran another version of this series ({str(doc.get('series'))[:12]})."
    if not doc.get("lines"):
        return ("The last `make flows` of this series has no summary per kind of flow: run `make flows` (or "
                "`python -m scripts.flows --render`).")
    return (f"The flow table (`make flows`, {doc['selection']}: save/restart flows of a training job, each on the "
            "release and on this stack, against the same job run uninterrupted), per kind of flow:\n\n"
            + "\n".join(f"- {line}" for line in doc["lines"]))


def proposal_header(pr: int | None) -> str:
    """Markdown: for a commit whose bug an open pull request already fixes (``proposal_on`` of its entry in
    ``[[<name>.gate.commits]]``), the line that makes the body a review comment on that PR, not a PR of its own."""
    if pr is None:
        return ""
    return (f"**A review comment for #{pr}, not a pull request of its own**: #{pr} fixes this bug; the commit below "
            "is offered to it as a proposal, crediting its author, with what it adds point by point.\n\n")


def stack_header(steps: list[dict], number: int, names: list[str]) -> str:
    """Markdown: the stack, newest first, this PR marked ``__->__``; '' for a series of one commit."""
    if len(steps) < 2:
        return ""
    lines = [f"Stack ({len(steps)} PRs, merged bottom up; the bodies: {', '.join(f'`{n}`' for n in names)}):"]
    for step in reversed(steps):
        mark = "__->__ " if step["commit"] == number else ""
        lines.append(f"* {mark}{step['commit']}/{len(steps)} {step['subject']}")
    return "\n".join(lines) + "\n\n"


def rev_tree(repo: Path) -> str:
    """The tree id of HEAD: what the gate's *after* stage must have tested (its commit, made in a clone, is gone)."""
    return git(repo, "rev-parse", "HEAD^{tree}").stdout.strip()


def defined_tests(repo: Path, commit: str, files: set[str]) -> dict[str, set[str]]:
    """{file: ``def test_*`` names in ``files`` at ``commit`` of ``repo``} (a file missing there: no names)."""
    found = {}
    for file in files:
        text = git(repo, "show", f"{commit}:{file}", check=False).stdout
        found[file] = set(re.findall(r"^\s*def (test_\w+)\(", text, re.M))
    return found


def bodies(docs: Path, report_file: Path, checkouts: Path, patches: Path, pins: Path, url: str,
           matrix_file: Path, outdated_file: Path = outdated.RECORD, flows_dir: Path | None = None
           ) -> dict[str, dict[str, str]]:
    """{name: {file name: the filled body}} for every upstream with a directory of templates in ``docs``; raise
    KitError (nothing written) on any problem. ``outdated_file``: the record of the last ``make outdated``;
    ``flows_dir``: where ``make flows`` wrote its reports (default: beside ``report_file``'s folder, ``flows/``)."""
    flows_dir = report_file.parent.parent / "flows" if flows_dir is None else flows_dir
    if not report_file.exists():
        raise KitError(f"{report_file} is missing: run `make gate` first")
    report = json.loads(report_file.read_text())
    table = sources.load(pins)
    record = outdated.load_record(outdated_file)
    made = {}
    for folder in sorted(p for p in docs.iterdir() if p.is_dir()):
        name = folder.name
        entry = report["upstreams"].get(name)
        if entry is None or entry["violations"]:
            raise KitError(f"the gate report has no clean result for {name}: run `make gate` and fix it first")
        steps = entry.get("steps") or [entry]
        files = series.patch_files(patches / name)
        if len(steps) > 1 and len(files) != len(steps):
            raise KitError(f"the gate report judged {len(steps)} commits of {name}, patches/{name}/ holds "
                           f"{len(files)}: run `make gate` again")
        per_step = [[f] for f in files] if len(steps) > 1 else [files]
        templates = [folder / f"{n}.md" for n in range(1, len(steps) + 1)]
        missing = [t for t in templates if not t.exists()]
        if missing:
            raise KitError(f"{missing[0]} is missing: write the body of commit {missing[0].stem} of {name}")
        repo = checkouts / name
        last = steps[-1]["stages"]["after"] if len(steps) > 1 else list(entry["stages"])[-1]
        if entry["stages"][last].get("tree") != rev_tree(repo):
            raise KitError(f"the gate report was made from another tree of {name} than HEAD's: run `make gate` again")
        prefix = f"upstream/{name}/"
        names = [body_name(n, stack.subject(p[0])) for n, p in enumerate(per_step, 1)] if files else ["1.md"]
        commits = table[name].get("gate", {}).get("commits", [])
        proposals = {n: c["proposal_on"] for n, c in enumerate(commits, 1) if c.get("proposal_on")}
        names = [f"{n}-review-comment-on-{proposals[n]}.md" if n in proposals else file
                 for n, file in enumerate(names, 1)]
        upstream_tests = table[name].get("gate", {}).get("upstream_tests", [])
        matrix = matrix_sentence(name, entry, matrix_file)
        made[name] = {}
        for number, (step, template, own) in enumerate(zip(steps, templates, per_step, strict=True), 1):
            tested = {key.removeprefix(prefix).split("::")[0] for key in step["tests"] if key.startswith(prefix)}
            release = outdated.release_status(record, table[name].get("package", name), entry["version"])
            gate = gate_section(name, entry, step, table[name], own, defined_tests(repo, "HEAD", tested), release)
            gate += "\n\n" + flows_sentence(name, flows_dir / f"{name}.json", rev(repo, "HEAD")) + "\n"
            touched = {f for p in own for f in stack.changed_files(p)}
            mine = [t for t in upstream_tests if t in touched] if len(steps) > 1 else upstream_tests
            reproduce = reproduce_section(name, entry, mine or upstream_tests, url)
            body = template.read_text().replace("{gate}", gate).replace("{reproduce}", reproduce)
            header = proposal_header(proposals.get(number)) + stack_header(steps, number, names)
            made[name][names[number - 1]] = header + body.replace("{matrix}", matrix)
    return made


def main(argv: list[str] | None = None) -> int:
    """Write one body per commit of every upstream that has templates (all or none); return 0, or 1 with one line
    on a KitError."""
    parser = ArgumentParser(prog="python -m scripts.pr", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=sources.KIT_ROOT / "docs" / "pr")
    parser.add_argument("--report", type=Path, default=sources.KIT_ROOT / "build" / "gate" / "report.json")
    parser.add_argument("--matrix", type=Path, default=sources.KIT_ROOT / "build" / "matrix" / "report.json")
    parser.add_argument("--outdated", type=Path, default=outdated.RECORD, help="the record of the last make outdated")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "pr")
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--root", type=Path, default=sources.KIT_ROOT, help="the kit's clone (its origin: KIT_URL)")
    parser.add_argument("--issues", type=Path, default=sources.KIT_ROOT / "docs" / "issues",
                        help="the bug reports to file upstream, <key>.md for a commit's key")
    parser.add_argument("--draft", action="store_true",
                        help="write bodies that still hold a placeholder for an issue number (to read, not to open)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> int:
        try:
            url = kit_url(os.environ, args.root, args.draft)
            made = bodies(args.docs, args.report, args.checkouts, args.patches, args.sources, url, args.matrix,
                          args.outdated)
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        report = json.loads(args.report.read_text())
        keys = {name: [step.get("key", "") for step in report["upstreams"][name].get("steps") or [{}]]
                for name in made}
        found = placeholders(made, keys, args.issues)
        if found and not args.draft:
            print(f"error: {plural(len(found), 'PR body', 'PR bodies')} would ship a placeholder for an issue "
                  f"number, nothing was written: {'; '.join(found)}; then put each issue's number in its "
                  "docs/pr/<name>/<n>.md and commit message (README, 'From make test to an opened PR'), or read "
                  "them first with `make pr DRAFT=1`", file=sys.stderr)
            return 1
        for line in found:
            print(f"WARNING: DRAFT, do not open this pull request yet: {line}", file=sys.stderr, flush=True)
        for name, files in made.items():
            folder = args.out / name
            shutil.rmtree(folder, ignore_errors=True)  # no body of another series stays
            (args.out / f"{name}.md").unlink(missing_ok=True)  # the old one-file layout
            folder.mkdir(parents=True)
            for file, body in files.items():
                (folder / file).write_text(body)
                print(f"pr: wrote {folder / file}")
            (folder / ".series").write_text(report["upstreams"][name]["series_id"] + "\n")
            for note in placeholder_notes(args.patches / name):
                print(f"  {note}")
        if found:
            print(f"WARNING: {plural(len(found), 'body', 'bodies')} above still {verb(len(found), 'holds', 'hold')} "
                  "a placeholder for an issue number (DRAFT=1): file the bug reports first", file=sys.stderr)
        return 0

    return runlock.interruptible(work, lambda: runlock.describe_checkouts(args.checkouts, args.patches, args.sources))


if __name__ == "__main__":
    sys.exit(main())
