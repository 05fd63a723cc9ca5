"""`make pr` on the tiny upstream: all bodies or none, the kit linked, new tests told from existing ones, claims
about what ran only from results on disk, and one body per commit of a stack headed by the stack.

The series adds ``tests/test_fixed.py::test_value_is_two`` (FAIL_TO_PASS) and ``test_value_is_int`` (a new
guard); ``tests/test_tiny.py::test_value`` is an existing upstream test. The gate report is written by hand
with the shape scripts/gate/ writes.
"""

import json

import pytest

from scripts import pr
from scripts.git import git, rev
from tests.kit.test_safety import AUTHOR, two_upstreams

NEW_TESTS = ("def test_value_is_two():\n    import tiny\n\n    assert tiny.VALUE == 2\n\n\n"
             "def test_value_is_int():\n    import tiny\n\n    assert isinstance(tiny.VALUE, int)\n")
F2P, NEW_P2P = "tests/test_fixed.py::test_value_is_two", "tests/test_fixed.py::test_value_is_int"
OLD_P2P = "tests/test_tiny.py::test_value"
SERIES_ID = "0123456789ab"
BODY = "1-set-value-to-2.md"


def head_tree(repo) -> str:
    """The tree id of HEAD, which the gate records for each stage it ran (its commits are made in clones)."""
    return git(repo, "rev-parse", "HEAD^{tree}").stdout.strip()


def entry(repo, name: str, violations: list[str]) -> dict:
    prefix = f"upstream/{name}/"
    tests = {prefix + F2P: {"before": "failed", "after": "passed"}, prefix + NEW_P2P: {"before": "passed",
             "after": "passed"}, prefix + OLD_P2P: {"before": "passed", "after": "passed"}}
    stages = {"before": {"commit": ""}, "after": {"commit": rev(repo), "tree": head_tree(repo)}}
    return {"version": "1.0", "series_id": SERIES_ID, "stages": stages,
            "FAIL_TO_PASS": [prefix + F2P],
            "PASS_TO_PASS": [prefix + NEW_P2P, prefix + OLD_P2P], "tests": tests, "violations": violations}


@pytest.fixture
def pr_kit(kit):
    """Two upstreams (tiny, other) with the series applied, a template each, and a clean gate report."""
    two_upstreams(kit)
    assert kit.run("apply")[0] == 0
    for name in ("tiny", "other"):
        repo = kit.root / "upstream" / name
        (repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")
        (repo / "tests" / "test_fixed.py").write_text(NEW_TESTS)
        git(repo, "add", "--all")
        git(repo, *AUTHOR, "commit", "--quiet", "--signoff", "--message", "Set VALUE to 2\n\nFixes #1")
    assert kit.run("export")[0] == 0
    for name in ("tiny", "other"):
        (kit.root / "docs" / name).mkdir(parents=True)
        (kit.root / "docs" / name / "1.md").write_text("# Fix\n\n{gate}\n\n{matrix}\n\n## Reproduce\n\n{reproduce}\n")
    report = {"upstreams": {name: entry(kit.root / "upstream" / name, name, []) for name in ("tiny", "other")}}
    (kit.root / "report.json").write_text(json.dumps(report))
    return kit


def run_pr(kit, monkeypatch, url: str | None = "https://github.com/someone/kit", *options: str) -> int:
    if url is None:
        monkeypatch.delenv("KIT_URL", raising=False)
    else:
        monkeypatch.setenv("KIT_URL", url)
    return pr.main([f"--docs={kit.root / 'docs'}", f"--report={kit.root / 'report.json'}", f"--out={kit.root / 'out'}",
                    f"--matrix={kit.root / 'matrix.json'}", f"--outdated={kit.root / 'outdated.json'}",
                    f"--issues={kit.root / 'issues'}",
                    f"--checkouts={kit.root / 'upstream'}", f"--patches={kit.root / 'patches'}",
                    f"--sources={kit.root / 'sources.toml'}", f"--root={kit.root}", *options])


def test_body_links_the_kit_and_tells_new_tests_from_existing_ones(pr_kit, monkeypatch):
    assert run_pr(pr_kit, monkeypatch) == 0
    body = (pr_kit.root / "out" / "tiny" / BODY).read_text()
    assert "1 new test of this PR fails before and passes after; 1 new test of this PR passes in both stages; " \
           "1 existing test of `tests/test_tiny.py` (already in the release) passes in both stages" in body
    assert "With the contribution kit, https://github.com/someone/kit " in body
    assert "git clone https://github.com/someone/kit && cd kit" in body
    assert "Base: the release tag `v1.0`" in body and "not checked against the default branch" in body


def test_default_branch_check_is_reported(pr_kit, monkeypatch):
    with open(pr_kit.root / "sources.toml", "a") as f:
        f.write('[tiny.default_branch]\nbranch = "main"\ncommit = "0123456789abcdef"\ncommitted = "2026-01-02"\n'
                'checked = "2026-01-03"\napplies = true\nhow = "`git am --3way`"\n')
    assert run_pr(pr_kit, monkeypatch) == 0
    body = (pr_kit.root / "out" / "tiny" / BODY).read_text()
    assert "A check against the default branch `main` as of commit `0123456789ab`" in body
    assert "for another version of the series than this one (`0123456789ab`): check again" in body
    text = (pr_kit.root / "sources.toml").read_text()
    (pr_kit.root / "sources.toml").write_text(text.replace('how = "`git am --3way`"\n',
                                                           f'how = "`git am --3way`"\nseries = "{SERIES_ID}"\n'))
    assert run_pr(pr_kit, monkeypatch) == 0
    assert ("also applies to the default branch `main` as of commit `0123456789ab` (committed 2026-01-02; checked "
            "2026-01-03 with `git am --3way`)") in (pr_kit.root / "out" / "tiny" / BODY).read_text()


def test_both_bodies_or_none(pr_kit, monkeypatch, capsys):
    report = json.loads((pr_kit.root / "report.json").read_text())
    report["upstreams"]["tiny"]["violations"] = ["tiny x: FAIL_TO_PASS test passed before the series"]
    (pr_kit.root / "report.json").write_text(json.dumps(report))
    assert run_pr(pr_kit, monkeypatch) == 1
    assert not (pr_kit.root / "out").exists()
    assert "no clean result for tiny" in capsys.readouterr().err


@pytest.mark.parametrize("origin, expected", [
    ("git@github.com:someone/kit.git", "https://github.com/someone/kit"),
    ("https://github.com/someone/kit.git", "https://github.com/someone/kit"),
])
def test_kit_url_from_origin(tmp_path, origin, expected):
    git(tmp_path, "init", "--quiet")
    git(tmp_path, "remote", "add", "origin", origin)
    assert pr.kit_url({}, tmp_path) == expected


def test_a_local_path_as_kit_url_is_named_as_such(pr_kit, monkeypatch, capsys):
    """Issue 33, item 5: `make pr KIT_URL=../my-kit` said "KIT_URL is unset"."""
    assert run_pr(pr_kit, monkeypatch, "../my-kit") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KIT_URL=../my-kit is not a public URL" in err and "unset" not in err, err
    assert not (pr_kit.root / "out").exists()


def test_no_usable_url_is_refused_before_anything_is_written(pr_kit, monkeypatch, capsys):
    git(pr_kit.root, "init", "--quiet")
    git(pr_kit.root, "remote", "add", "origin", "/work/main")
    assert run_pr(pr_kit, monkeypatch, url=None) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "origin is /work/main, not a public URL" in err and "KIT_URL=" in err
    assert not (pr_kit.root / "out").exists()


def test_a_draft_without_url_is_told_the_draft_command(pr_kit, monkeypatch, capsys):
    """A newcomer's `make pr DRAFT=1` in a local clone was told `make pr KIT_URL=...`, which then refused the
    placeholders: the command it names keeps DRAFT=1."""
    git(pr_kit.root, "init", "--quiet")
    git(pr_kit.root, "remote", "add", "origin", "/work/main")
    assert run_pr(pr_kit, monkeypatch, None, "--draft") == 1
    assert "`make pr DRAFT=1 KIT_URL=" in capsys.readouterr().err



def matrix_report(series_id: str) -> dict:
    rows = [{"upstream": "tiny", "release": release, "dependency": dep, "meets": True}
            for release in ("0.10", "0.9") for dep in ("torchdata 0.10.1", "torchdata 0.9.0")]
    return {"date": "2026-12-01 10:00 UTC", "series": {"tiny": series_id}, "rows": rows}


@pytest.mark.parametrize("matrix, sentence", [
    (None, "No `make matrix` result is on record: only tiny 1.0 was gated (the table above)."),
    (matrix_report("another"), "The last `make matrix` (2026-12-01 10:00 UTC) judged another version of this "
                               "series: only tiny 1.0 was gated"),
    (matrix_report(SERIES_ID), "`make matrix` (2026-12-01 10:00 UTC, torch and the kit's lock) gated this series on "
                               "tiny 0.9, 0.10 with torchdata 0.9.0, torchdata 0.10.1: 4 of 4 runs met their "
                               "declaration."),
], ids=["no-matrix", "matrix-of-another-series", "matrix-of-this-series"])
def test_the_matrix_claim_comes_from_the_matrix_report_of_this_series(pr_kit, monkeypatch, matrix, sentence):
    if matrix:
        (pr_kit.root / "matrix.json").write_text(json.dumps(matrix))
    assert run_pr(pr_kit, monkeypatch) == 0
    assert sentence in (pr_kit.root / "out" / "tiny" / BODY).read_text()


def test_a_stack_gets_one_body_per_commit_headed_by_the_stack(pr_kit, monkeypatch):
    repo, prefix = pr_kit.root / "upstream" / "tiny", "upstream/tiny/"
    (repo / "tests" / "test_more.py").write_text("def test_more():\n    import tiny\n\n    assert tiny.MORE\n")
    (repo / "tiny" / "__init__.py").write_text("VALUE = 2\nMORE = 3\n")
    git(repo, "add", "--all")
    git(repo, *AUTHOR, "commit", "--quiet", "--signoff", "--message", "Add MORE\n\nA follow-up.")
    assert pr_kit.run("export")[0] == 0
    report = json.loads((pr_kit.root / "report.json").read_text())
    first = report["upstreams"]["tiny"]
    more = prefix + "tests/test_more.py::test_more"
    second = {"commit": 2, "of": 2, "subject": "Add MORE", "stages": {"before": "stage-1", "after": "stage-2"},
              "FAIL_TO_PASS": [more], "PASS_TO_PASS": first["FAIL_TO_PASS"] + first["PASS_TO_PASS"],
              "tests": {**{k: {"before": "passed", "after": "passed"} for k in first["tests"]},
                        more: {"before": "failed", "after": "passed"}}, "violations": []}
    first |= {"commit": 1, "of": 2, "subject": "Set VALUE to 2", "stages": {"before": "stage-0", "after": "stage-1"}}
    report["upstreams"]["tiny"] = {**first, "steps": [dict(first), second],
                                   "stages": {"stage-2": {"commit": rev(repo), "tree": head_tree(repo)}}}
    (pr_kit.root / "report.json").write_text(json.dumps(report))
    (pr_kit.root / "docs" / "tiny" / "2.md").write_text("# More\n\n{gate}\n\n{reproduce}\n")
    assert run_pr(pr_kit, monkeypatch) == 0
    made = sorted(p.name for p in (pr_kit.root / "out" / "tiny").glob("*.md"))
    assert made == ["1-set-value-to-2.md", "2-add-more.md"]
    body = (pr_kit.root / "out" / "tiny" / "2-add-more.md").read_text()
    assert body.startswith("Stack (2 PRs, merged bottom up; the bodies: `1-set-value-to-2.md`, `2-add-more.md`):\n"
                           "* __->__ 2/2 Add MORE\n* 1/2 Set VALUE to 2\n\n# More")
    assert "+ the 1 PR below this one in the stack." in body
    assert "1 new test of this PR fails before and passes after; 0 new tests of this PR pass in both stages" in body
    (pr_kit.root / "docs" / "tiny" / "2.md").unlink()
    assert run_pr(pr_kit, monkeypatch) == 1


def outdated_record(kit, newest: str) -> None:
    """The last `make outdated`: tiny 1.0 released 2026-02-01, 1.1 on 2026-03-01; ``newest`` the newest of them."""
    released = {"1.0": "2026-02-01", "1.1": "2026-03-01"}
    (kit.root / "outdated.json").write_text(json.dumps({"asked": "2026-12-03 10:00 UTC", "packages": {
        "tiny": {"newest": newest, "released": {v: d for v, d in released.items() if v <= newest}}}}))


@pytest.mark.parametrize("newest, release, snapshot", [
    (None, "No `make outdated` is on record for tiny: whether it released after 1.0 is not known",
     "how old that snapshot is relative to the newest release is not known (no `make outdated` on record for tiny)"),
    ("1.0", "tiny 1.0 is the newest release, as of the last `make outdated` (2026-12-03 10:00 UTC).",
     "that snapshot is 30 days older than tiny 1.0 (2026-02-01), this base and the newest release: the release is "
     "the newest upstream code the series was checked against."),
    ("1.1", "tiny 1.0 is not the newest release: tiny 1.1 (2026-03-01) is newer, as of the last `make outdated`",
     "that snapshot is 58 days older than tiny 1.1 (2026-03-01), the newest release, which the series was not "
     "checked against; the newest upstream code it was checked against is this base, tiny 1.0 (2026-02-01)."),
], ids=["no-record", "base-is-newest", "newer-release"])
def test_the_body_says_whether_the_base_is_newest_and_how_old_the_snapshot_is(pr_kit, monkeypatch, newest, release,
                                                                               snapshot):
    """Issue 30: a body never calls a base the newest when the last `make outdated` knows a newer one, and dates the
    default-branch snapshot against the newest release."""
    if newest:
        outdated_record(pr_kit, newest)
    with open(pr_kit.root / "sources.toml", "a") as f:
        f.write('[tiny.default_branch]\nbranch = "main"\ncommit = "0123456789abcdef"\ncommitted = "2026-01-02"\n'
                f'checked = "2026-01-03"\napplies = true\nhow = "`git am --3way`"\nseries = "{SERIES_ID}"\n')
    assert run_pr(pr_kit, monkeypatch) == 0
    body = (pr_kit.root / "out" / "tiny" / BODY).read_text()
    assert release in body and snapshot in body
    assert ("is the newest release" in body) == (newest == "1.0")


def stacked_report(pr_kit, second_template: str) -> None:
    """Commit a follow-up "Add MORE" (key "more") on tiny, export it, and write its step into the gate report."""
    repo, prefix = pr_kit.root / "upstream" / "tiny", "upstream/tiny/"
    (repo / "tests" / "test_more.py").write_text("def test_more():\n    import tiny\n\n    assert tiny.MORE\n")
    (repo / "tiny" / "__init__.py").write_text("VALUE = 2\nMORE = 3\n")
    git(repo, "add", "--all")
    git(repo, *AUTHOR, "commit", "--quiet", "--signoff", "--message",
        "Write each reshuffle of the difficulty clusters to a file of its own\n\nA follow-up.")
    assert pr_kit.run("export")[0] == 0
    report = json.loads((pr_kit.root / "report.json").read_text())
    first = report["upstreams"]["tiny"]
    more = prefix + "tests/test_more.py::test_more"
    second = {"commit": 2, "of": 2, "key": "more", "subject": "Add MORE",
              "stages": {"before": "stage-1", "after": "stage-2"}, "FAIL_TO_PASS": [more],
              "PASS_TO_PASS": first["FAIL_TO_PASS"] + first["PASS_TO_PASS"],
              "tests": {**{k: {"before": "passed", "after": "passed"} for k in first["tests"]},
                        more: {"before": "failed", "after": "passed"}}, "violations": []}
    first |= {"commit": 1, "of": 2, "key": "1", "subject": "Set VALUE to 2",
              "stages": {"before": "stage-0", "after": "stage-1"}}
    report["upstreams"]["tiny"] = {**first, "steps": [dict(first), second],
                                   "stages": {"stage-2": {"commit": rev(repo), "tree": head_tree(repo)}}}
    (pr_kit.root / "report.json").write_text(json.dumps(report))
    (pr_kit.root / "docs" / "tiny" / "2.md").write_text(second_template)


PLACEHOLDER_BODY = ("# More\n\nFixes #<the follow-up issue: MORE > 0 is missing> (to be filed)\n\n{gate}\n\n"
                    "{reproduce}\n")


def test_a_body_that_would_ship_a_placeholder_is_refused_naming_the_report_to_file(pr_kit, monkeypatch, capsys):
    """Issue 33, item 3: two DeepSpeed PR bodies shipped `Fixes #<the follow-up issue: ...>` and make pr said
    nothing."""
    stacked_report(pr_kit, PLACEHOLDER_BODY)
    (pr_kit.root / "issues").mkdir()
    (pr_kit.root / "issues" / "more.md").write_text("# [BUG] MORE is missing\n")
    capsys.readouterr()
    assert run_pr(pr_kit, monkeypatch) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: 1 PR body would ship a placeholder for an issue number, nothing was written: ")
    assert (f"tiny 2-write-each-reshuffle-of-the-difficulty-clusters-to-a-file-of-its-own.md says `#<the follow-up "
            f"issue: MORE > 0 is missing>`: file {pr_kit.root / 'issues' / 'more.md'} upstream") in err
    assert "`make pr DRAFT=1`" in err
    assert not (pr_kit.root / "out").exists()


def test_draft_writes_a_body_with_a_placeholder_and_warns_first(pr_kit, monkeypatch, capsys):
    stacked_report(pr_kit, PLACEHOLDER_BODY)
    capsys.readouterr()
    assert run_pr(pr_kit, monkeypatch, "https://github.com/someone/kit", "--draft") == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("WARNING: DRAFT, do not open this pull request yet: tiny 2-write-each-reshuffle-"
                                   "of-the-difficulty-clusters-to-a-file-of-its-own.md says `#<the follow-up issue: "
                                   "MORE > 0 is missing>`: file its bug report upstream\n"), captured.err
    assert captured.err.splitlines()[-1].startswith("WARNING: 1 body above still holds")
    # The whole subject names the file, not format-patch's cut of it ("...-to-a-new-fil.md").
    body = pr_kit.root / "out" / "tiny" / "2-write-each-reshuffle-of-the-difficulty-clusters-to-a-file-of-its-own.md"
    assert "Fixes #<the follow-up issue: MORE > 0 is missing>" in body.read_text()


def test_a_commit_whose_bug_has_an_open_pr_gets_a_review_comment_for_it():
    """``proposal_on`` in a commit's ``[[<name>.gate.commits]]`` table (issue 40: the kit's commit 3 goes to #4165)."""
    from scripts.pr import proposal_header

    assert proposal_header(None) == ""
    assert proposal_header(4165).startswith("**A review comment for #4165, not a pull request of its own**")
