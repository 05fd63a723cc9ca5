"""The gate on a throw-away stack of three commits of the tiny upstream: each commit is judged on top of the ones
before it, a broken commit fails its own step only and is named, and a stack that cannot be judged so is refused
in one line.

The stack: commit 1 sets ``tiny.VALUE`` to 2 (``Fixes #1``, key 1) and adds ``tests/test_fixed.py``; commit 2 adds
``tiny.MORE`` (key ``"more"``, a follow-up without an issue number) and ``tests/test_more.py``; commit 3 adds
``tiny.THIRD`` (``Fixes #3``, key 3) and ``tests/test_third.py``. The kit's suite holds one test marked with each
key and one unmarked guard.
"""

import json

import pytest

from scripts import gate, matrix, stack, worktree
from scripts.gate import grading, report
from tests.kit.test_gate import commit

KIT_SUITE = '''import pytest

import tiny


@pytest.mark.regression("tiny", 1)
def test_value_is_fixed():
    assert tiny.VALUE == 2, f"VALUE is {tiny.VALUE}, not 2"


@pytest.mark.regression("tiny", "more")
def test_more():
    assert getattr(tiny, "MORE", None) == 3, "tiny has no MORE"


@pytest.mark.regression("tiny", 3)
def test_third():
    assert getattr(tiny, "THIRD", None) == 4, "tiny has no THIRD"


def test_value_is_known():
    assert tiny.VALUE in (1, 2), f"VALUE is {tiny.VALUE}"
'''
TEST_FIXED = "import tiny\n\n\ndef test_value_is_two():\n    assert tiny.VALUE == 2, f'VALUE is {tiny.VALUE}'\n"
TEST_MORE = "import tiny\n\n\ndef test_more_is_three():\n    assert getattr(tiny, 'MORE', 0) == 3, 'no MORE'\n"
TEST_THIRD = "import tiny\n\n\ndef test_third_is_four():\n    assert getattr(tiny, 'THIRD', 0) == 4, 'no THIRD'\n"
TABLE = '''[tiny.gate]
upstream_tests = ["tests/test_fixed.py", "tests/test_more.py", "tests/test_third.py"]
[[tiny.gate.commits]]
key = 1
fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]
[[tiny.gate.commits]]
key = "more"
fail_to_pass = ["tests/test_more.py::test_more_is_three"]
[[tiny.gate.commits]]
key = 3
fail_to_pass = ["tests/test_third.py::test_third_is_four"]
'''
UP = "upstream/tiny/tests/"
KIT = "suites/tiny/test_tiny_kit.py::"


def make_stack(kit, second_fix: bool = True, third_breaks_first: bool = False, second_edits_first_test: bool = False
               ) -> None:
    """Commit the three commits in the tiny checkout and export them; the checkout is left on its base.
    ``second_edits_first_test``: commit 2 also adds a test to tests/test_fixed.py, which commit 1 added."""
    assert kit.run("apply")[0] == 0
    init = kit.repo / "tiny" / "__init__.py"
    more = {"tests/test_more.py": TEST_MORE}
    if second_edits_first_test:
        more["tests/test_fixed.py"] = TEST_FIXED + "\n\ndef test_value_is_not_one():\n    assert tiny.VALUE != 1\n"
    steps = [("VALUE = 2\n", {"tests/test_fixed.py": TEST_FIXED}, "Set VALUE to 2\n\nFixes #1"),
             ("VALUE = 2\nMORE = 3\n" if second_fix else "VALUE = 2\n", more, "Add MORE\n\nA follow-up."),
             (f"VALUE = {5 if third_breaks_first else 2}\nMORE = 3\nTHIRD = 4\n" if second_fix else
              f"VALUE = {5 if third_breaks_first else 2}\nTHIRD = 4\n", {"tests/test_third.py": TEST_THIRD},
              "Add THIRD\n\nFixes #3")]
    for code, files, message in steps:
        init.write_text(code)
        for path, text in files.items():
            (kit.repo / path).write_text(text)
        commit(kit.repo, message)
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0


def run(kit, capsys, table: str = TABLE) -> tuple[int, dict, str, str]:
    """Run the gate on the tiny stack; return (exit code, report.json, stdout, stderr)."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + table)
    (kit.root / "suites" / "tiny").mkdir(parents=True, exist_ok=True)
    (kit.root / "suites" / "tiny" / "test_tiny_kit.py").write_text(KIT_SUITE)
    argv = [f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
            f"--patches={kit.root / 'patches'}", f"--suites={kit.root / 'suites'}", f"--out={kit.root / 'out'}"]
    capsys.readouterr()
    code = gate.main(argv)
    report = kit.root / "out" / "report.json"
    captured = capsys.readouterr()
    return code, json.loads(report.read_text()) if report.exists() else {}, captured.out, captured.err


def test_a_good_stack_passes_step_by_step_in_n_plus_one_stages(kit, capsys):
    make_stack(kit)
    code, report, out, err = run(kit, capsys)
    assert code == 0, out + err
    tiny = report["upstreams"]["tiny"]
    assert [s["verdict"] for s in tiny["steps"]] == ["pass"] * 3
    assert list(tiny["stages"]) == ["stage-0", "stage-1", "stage-2", "stage-3"]  # after k shared with before k+1
    one, two, three = tiny["steps"]
    assert one["FAIL_TO_PASS"] == [f"{KIT}test_value_is_fixed", f"{UP}test_fixed.py::test_value_is_two"]
    assert two["FAIL_TO_PASS"] == [f"{KIT}test_more", f"{UP}test_more.py::test_more_is_three"]
    assert three["tests"][f"{UP}test_third.py::test_third_is_four"]["reason"] == "no THIRD"
    assert f"{UP}test_more.py::test_more_is_three" not in one["tests"]  # the next commit's test: not after 1's
    assert f"{KIT}test_third" not in two["tests"]  # a later commit's kit test is not judged at step 2
    assert set(three["PASS_TO_PASS"]) >= {f"{KIT}test_value_is_fixed", f"{UP}test_fixed.py::test_value_is_two",
                                          f"{KIT}test_more", f"{KIT}test_value_is_known"}
    md = (kit.root / "out" / "report.md").read_text()
    for k, subject in enumerate(["Set VALUE to 2", "Add MORE", "Add THIRD"], 1):
        assert f"| tiny {k}/3 | 1.0 |" in md and f"### {k}/3: {subject} (pass)" in md
    assert worktree.listed(kit.repo) == []
    # Issue 33, item 4: each stage's role, whether its failures are the expected ones, and counts that match the
    # report's summary table (the stack's line used to show commit 1's PASS_TO_PASS as if the stack's).
    assert "  stage-0: before tiny 1/3\n  stage-1: after tiny 1/3, before tiny 2/3\n" in out
    assert "gate stage-0: 4 failed, 1 passed (all expected) in " in out, out
    assert "gate stage-3: 7 passed in " in out
    assert (f"  tiny 1.0 (series), a stack of 3 commits: FAIL_TO_PASS 6 in all, violations 0; series id "
            f"{tiny['series_id']}\n") in out
    # The id README says to record after a default-branch check is in the report a person reads, not only its JSON.
    assert f"Series id `{tiny['series_id']}`: after checking this series against tiny's default branch" in md
    for step in tiny["steps"]:
        assert (f"    {step['commit']}/3 {step['subject']}: FAIL_TO_PASS {len(step['FAIL_TO_PASS'])}, PASS_TO_PASS "
                f"{len(step['PASS_TO_PASS'])}, violations 0") in out


def test_after_k_and_before_k_plus_1_of_the_same_code_run_the_kit_suite_once(kit, capsys):
    """Commit 2 edits the test file of commit 1: after 1 and before 2 are two stages, which hold the same code outside
    the test paths. The kit's suite runs in the first of them only, and both steps read its results there (issue 31);
    the second collects it (its conftest.py loads as in every stage) and deselects it; the stages of other code each
    run it."""
    make_stack(kit, second_edits_first_test=True)
    code, report, out, err = run(kit, capsys)
    assert code == 0, out + err
    tiny = report["upstreams"]["tiny"]
    assert list(tiny["stages"]) == [f"stage-{i}" for i in range(5)]
    ran = [stage for stage in tiny["stages"] if any(
        key.startswith(KIT) for key in grading.read_junit(kit.root / "out" / stage / "junit.xml"))]
    assert ran == ["stage-0", "stage-1", "stage-3", "stage-4"]
    assert tiny["stages"]["stage-2"]["kit_results_of"] == "stage-1" and "kit_tests_s" not in tiny["stages"]["stage-2"]
    assert "4 deselected" in (kit.root / "out" / "stage-2" / "pytest.log").read_text()
    assert all("kit_results_of" not in tiny["stages"][stage] for stage in ran)
    one, two, three = tiny["steps"]
    assert (one["stages"], two["stages"]) == ({"before": "stage-0", "after": "stage-1"},
                                              {"before": "stage-2", "after": "stage-3"})
    assert two["FAIL_TO_PASS"] == [f"{KIT}test_more", f"{UP}test_more.py::test_more_is_three"]  # kit: of stage-1
    assert set(two["PASS_TO_PASS"]) >= {f"{KIT}test_value_is_fixed", f"{UP}test_fixed.py::test_value_is_not_one"}
    assert "tiny: the base + commits 1..1 + the test hunks of commit 2 (kit suite: the results of stage-1)" in (
        kit.root / "out" / "report.md").read_text()


def test_a_stack_whose_second_fix_is_removed_fails_at_step_2_only(kit, capsys):
    make_stack(kit, second_fix=False)
    code, report, out, err = run(kit, capsys)
    assert code == 1
    steps = report["upstreams"]["tiny"]["steps"]
    assert [s["verdict"] for s in steps] == ["pass", "fail", "pass"], out
    assert f"tiny 2/3 {UP}test_more.py::test_more_is_three: FAIL_TO_PASS test failed after commit 2 (the fix " \
           "does not fix it): AssertionError: no MORE" in steps[1]["violations"]
    assert f"violation: tiny 2/3 {KIT}test_more: FAIL_TO_PASS test failed after commit 2" in out
    assert steps[2]["tests"][f"{KIT}test_more"]["carried"] is True


def test_a_third_commit_that_breaks_a_test_of_the_first_fails_as_pass_to_pass_at_step_3(kit, capsys):
    make_stack(kit, third_breaks_first=True)
    code, report, out, err = run(kit, capsys)
    assert code == 1
    assert "gate stage-3: 3 failed, 4 passed (3 failures NOT expected: see the log) in " in out, out
    steps = report["upstreams"]["tiny"]["steps"]
    assert [s["verdict"] for s in steps] == ["pass", "pass", "fail"], out
    assert f"tiny 3/3 {UP}test_fixed.py::test_value_is_two: PASS_TO_PASS test failed after: AssertionError: " \
           "VALUE is 5" in steps[2]["violations"]
    assert steps[2]["tests"][f"{KIT}test_value_is_fixed"]["contract"] == "PASS_TO_PASS"


def test_a_commit_whose_test_hunks_do_not_apply_on_the_commits_before_it_is_refused_in_one_line(kit, capsys):
    """Commit 2's test hunk, in tests/test_fixed.py, is written against a line that no commit before it makes."""
    make_stack(kit)
    second = sorted(kit.patches.glob("*.patch"))[1]
    second.write_text(second.read_text().replace(
        "diff --git a/tests/test_more.py",
        "diff --git a/tests/test_fixed.py b/tests/test_fixed.py\n--- a/tests/test_fixed.py\n"
        "+++ b/tests/test_fixed.py\n"
        "@@ -5 +5,2 @@\n-    assert tiny.THIRD\n+    assert tiny.THIRD\n+    assert tiny.MORE\n"
        "diff --git a/tests/test_more.py", 1))
    code, report, out, err = run(kit, capsys)
    assert code == 1 and report == {} and err.count("\n") == 1
    assert f"error: patches/tiny/{second.name}: its test hunks do not apply to the base + the commits before it" in err


@pytest.mark.parametrize("table, message", [
    (TABLE.replace('fail_to_pass = ["tests/test_more.py::test_more_is_three"]',
                   'fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]'),
     "FAIL_TO_PASS tests/test_fixed.py::test_value_is_two is not a test this commit adds"),
    (TABLE.replace("key = 3", "key = 4"), "key 4 is not the commit's Fixes #N (3)"),
    (TABLE.split("[[tiny.gate.commits]]\nkey = 3")[0], "lists 2 commits, patches/tiny/ holds 3: one "
     "[[tiny.gate.commits]] table per patch, in series order; a new commit needs a [[tiny.gate.commits]] table of its "
     "own in upstream/sources.toml (key, fail_to_pass) and its PR body docs/pr/tiny/3.md (README, 'Changing a "
     "patch')"),
], ids=["id-of-another-commit", "key-is-not-fixes", "a-table-short"])
def test_a_declaration_that_does_not_match_the_stack_is_refused_in_one_line(kit, capsys, table, message):
    make_stack(kit)
    code, report, out, err = run(kit, capsys, table)
    assert code == 1 and report == {} and err.count("\n") == 1
    assert message in err, err


def test_after_k_has_a_stage_of_its_own_when_commit_k_plus_1_changes_an_existing_test_file(tmp_path):
    """The plan: commit 2 edits the test file commit 1 added, so after 1 cannot be read from before 2's stage."""
    patches = []
    for number, (path, new) in enumerate([("tests/a.py", True), ("tests/a.py", False), ("tests/b.py", True)], 1):
        patch = tmp_path / f"000{number}-x.patch"
        patch.write_text(f"Subject: [PATCH {number}/3] x\n\ndiff --git a/{path} b/{path}\n"
                         + ("new file mode 100644\n" if new else "index 1..2\n"))
        patches.append(stack.Commit(number, 3, [patch], str(number), [], "x"))
    stages, steps = stack.plan(patches, ("tests/",))
    assert stages == [stack.Stage(0, 1), stack.Stage(1), stack.Stage(1, 2), stack.Stage(2, 3), stack.Stage(3)]
    assert [(s.before, s.after, s.hidden) for s in steps] == [(0, 1, []), (2, 3, ["tests/b.py"]), (3, 4, [])]


def test_a_gate_of_another_series_removes_the_pr_bodies_made_from_the_last_one(tmp_path, capsys):
    doc = {"upstreams": {"tiny": {"series_id": "new"}, "other": {"series_id": "same"}}}
    for name, made_from in (("tiny", "old"), ("other", "same")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1-fix.md").write_text("body")
        (tmp_path / name / ".series").write_text(made_from + "\n")
    (tmp_path / "other.md").write_text("a body of the one-file layout")
    report.remove_stale_bodies(doc, tmp_path)
    assert not (tmp_path / "tiny").exists() and not (tmp_path / "other.md").exists()
    assert "removed the PR bodies of tiny" in capsys.readouterr().out
    assert (tmp_path / "other" / "1-fix.md").exists()  # made from this series: kept


def test_the_matrix_gates_a_stack_commit_by_commit_and_records_its_series(kit, capsys):
    make_stack(kit, second_fix=False)
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + TABLE)
    (kit.root / "suites" / "tiny").mkdir(parents=True)
    (kit.root / "suites" / "tiny" / "test_tiny_kit.py").write_text(KIT_SUITE)
    capsys.readouterr()
    code = matrix.main([f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
                        f"--patches={kit.root / 'patches'}", f"--suites={kit.root / 'suites'}",
                        f"--cache={kit.cache}", f"--out={kit.root / 'matrix'}", "--jobs=1",
                        f"--pip-options=--no-index --find-links {kit.index} --no-build-isolation"])
    out = capsys.readouterr().out
    report = json.loads((kit.root / "matrix" / "report.json").read_text())
    [row] = report["rows"]
    assert code == 1 and row["gate"] == "fail" and row["FAIL_TO_PASS"] == 6, out
    assert any(note.startswith("tiny 2/3 ") for note in row["notes"]), row["notes"]
    assert report["series"] == {"tiny": stack.series_id(sorted(kit.patches.glob("*.patch")))} and report["date"]
