"""scripts/gate/grading.py and report.py without launching anything: JUnit in, verdicts and the report out."""

import json

import pytest

from scripts import outdated
from scripts.gate import grading, report
from scripts.gate.grading import Result

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.tiny.test_kit" name="test_fixed" file="tests/tiny/test_kit.py" time="0.5">
  <properties><property name="regression" value="tiny#1" /></properties>
  <failure message="AssertionError: batch index 2 diverged first&#10;more">long traceback</failure></testcase>
<testcase classname="tests.tiny.test_kit.TestGroup" name="test_guard[a-b]" file="tests/tiny/test_kit.py" time="1" />
<testcase classname="" name="up.scripts.run" file="up/scripts/run.py" time="6"><error message="crashed">log</error>
</testcase>
</testsuite></testsuites>"""


def test_read_junit_names_tests_by_node_id_and_keeps_the_evidence(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    results = grading.read_junit(path, rename=lambda key: key.replace("up/", "upstream/tiny/"))
    assert results == {
        "tests/tiny/test_kit.py::test_fixed": Result("failed", "AssertionError: batch index 2 diverged first\nmore",
                                                     "tiny#1", "long traceback", 0.5),
        "tests/tiny/test_kit.py::TestGroup::test_guard[a-b]": Result("passed", seconds=1.0),
        "upstream/tiny/scripts/run.py": Result("error", "crashed", "", "log", 6.0),
    }


@pytest.mark.parametrize("message, expected", [
    ("assert 1 == 2", True),
    ("AssertionError: the partition is broken", True),
    ("torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 0 terminated with the following error:\n"
     "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nAssertionError: 10 samples missing", True),
    ("torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 0 terminated with the following error:\n"
     "Traceback (most recent call last):\nModuleNotFoundError: No module named 'x'", False),
    ("ModuleNotFoundError: No module named 'x'", False),
    ("Failed: Timeout", False),
])
def test_only_assertions_count_as_reproducing_failures(message, expected):
    assert grading.is_assertion(message) is expected


F2P = "upstream/tiny/tests/test_fixed.py::test_two"
KIT = "tests/tiny/test_kit.py::test_fixed"
GUARD = "tests/tiny/test_kit.py::test_guard"


def upstream(**changes) -> grading.Upstream:
    """A graded upstream where everything holds, with ``changes`` applied to its fields."""
    step = grading.Step(fail_to_pass={F2P}, stages={"before": "before", "after": "after"})
    up = grading.Upstream("tiny", "1.0", "a" * 40, steps=[step], upstream_tests=True,
                          stages={"before": {"commit": "b" * 40, "wall_s": 3.0},
                                  "after": {"commit": "c" * 40, "wall_s": 2.0}},
                          imports={"before": {"processes": 1, "modules": 2, "outside": []}})
    step.before = {F2P: Result("failed", "AssertionError: union=71/96, missing=25\nwhere ...", text="tb"),
                   KIT: Result("failed", "assert [1, 2] == [2, 1]", "tiny#1"), GUARD: Result("passed")}
    step.after = {F2P: Result("passed"), KIT: Result("passed", regression="tiny#1"), GUARD: Result("passed")}
    for name, value in changes.items():
        setattr(step if hasattr(step, name) else up, name, value)
    return up


META = {"wall_s": 12.5, "versions": {"python": "3.11.7", "torch": "2.13.0", "torchdata": "0.11.0", "numpy": "2.3.5"},
        "series": {"kit_commit": "d" * 40, "uncommitted": []}}


def test_report_gives_each_fail_to_pass_test_its_reason_and_the_summary_first():
    doc, md, excerpts = report.build([upstream()], META)
    tiny = doc["upstreams"]["tiny"]
    assert doc["verdict"] == tiny["verdict"] == "pass" and excerpts == {}
    assert tiny["FAIL_TO_PASS"] == [KIT, F2P] and tiny["PASS_TO_PASS"] == [GUARD]
    assert tiny["tests"][F2P]["reason"] == "union=71/96, missing=25"
    assert tiny["tests"][KIT]["reason"] == "[1, 2] == [2, 1]"
    assert tiny["tests"][KIT]["bare"] is True and "bare" not in tiny["tests"][F2P]
    assert "1 FAIL_TO_PASS test fails before with a bare `assert` (pytest's rendering of the values, no sentence " \
           f"of the test's own saying what went wrong): `{KIT}`" in md
    assert doc["versions"]["torchdata"] == "0.11.0" and tiny["base"] == "a" * 40
    assert md.index("| tiny | 1.0 | `aaaaaaaaaaaa` | series | 2 | 1 | 0 | pass |") < md.index("<details>")
    assert f"| `{F2P}` | FAIL_TO_PASS | failed: union=71/96, missing=25 | passed | yes |" in md
    assert "torch 2.13.0, torchdata 0.11.0, numpy 2.3.5" in md
    json.dumps(doc)


def test_a_child_process_assertion_is_the_reason():
    message = ("torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 1 terminated with the following "
               "error:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\nAssertionError: "
               "union=71/96, missing=25\n")
    assert grading.reason(Result("failed", message)) == "union=71/96, missing=25"


def test_each_violation_links_to_its_log_excerpt():
    broken = upstream()
    step = broken.steps[0]
    step.after = {**step.after, GUARD: Result("failed", "AssertionError: guard broke", text="the traceback")}
    doc, md, excerpts = report.build([broken], META)
    row = doc["upstreams"]["tiny"]["tests"][GUARD]
    assert doc["verdict"] == "fail" and row["ok"] is False
    assert excerpts[row["excerpt"]].startswith(f"{GUARD}\nviolation: PASS_TO_PASS test failed after: ")
    assert "--- after: failed\nthe traceback" in excerpts[row["excerpt"]]
    assert f"([log excerpt]({row['excerpt']}))" in md and f"[**no**]({row['excerpt']})" in md


@pytest.mark.parametrize("change, violation", [
    ({"after": {}}, f"tiny {F2P}: missing after"),
    ({"problems": ["tiny after: 3 modules imported from outside the stage's tree, e.g. /x.py"]},
     "tiny after: 3 modules imported from outside the stage's tree, e.g. /x.py"),
    ({"fail_to_pass": set()}, "tiny: no FAIL_TO_PASS upstream test declared in [tiny.gate]"),
])
def test_violations(change, violation):
    _, violations, _ = grading.judge(upstream(**change))
    assert violation in violations


def test_declared_fix_check_is_reported_with_its_reason_and_skipped_files():
    up = upstream(check="fix", reason="one import line of tests/test_data_loader.py differs",
                  skipped=["tests/test_data_loader.py"])
    doc, md, _ = report.build([up], META)
    assert doc["upstreams"]["tiny"]["check"] == "fix"
    assert doc["upstreams"]["tiny"]["skipped_upstream_tests"] == ["tests/test_data_loader.py"]
    assert "**fix only** (one import line of tests/test_data_loader.py differs)" in md


KIT2 = "tests/tiny/test_kit.py::test_follow_up"
F2P2 = "upstream/tiny/tests/test_more.py::test_three"


def stack(after2: dict | None = None) -> grading.Upstream:
    """A stack of two commits (keys 1 and "more") where everything holds; ``after2`` overrides step 2's after."""
    failing, passing = Result("failed", "AssertionError: VALUE is 1, not 2"), Result("passed")
    one = grading.Step(1, 2, "1", {"more"}, "Set VALUE to 2", "0001-Set-VALUE-to-2.patch",
                       {KIT: Result("failed", "AssertionError: VALUE is 1", "tiny#1"), F2P: failing, GUARD: passing,
                        KIT2: Result("failed", "AssertionError: no MORE", "tiny#more")},
                       {KIT: Result("passed", regression="tiny#1"), F2P: passing, GUARD: passing,
                        KIT2: Result("failed", "AssertionError: no MORE", "tiny#more")},
                       {F2P}, {"before": "stage-0", "after": "stage-1"})
    two = grading.Step(2, 2, "more", set(), "Add MORE", "0002-Add-MORE.patch",
                       {**one.after, F2P2: Result("failed", "AssertionError: no MORE")},
                       {**one.after, KIT2: Result("passed", regression="tiny#more"), F2P2: passing, **(after2 or {})},
                       {F2P2}, {"before": "stage-1", "after": "stage-2"})
    stages = {f"stage-{i}": {"commit": str(i) * 40, "wall_s": 1.0, "holds": "x"} for i in range(3)}
    return grading.Upstream("tiny", "1.0", "a" * 40, steps=[one, two], keys={"1", "more"}, upstream_tests=True,
                            stages=stages)


def test_a_stack_is_judged_commit_by_commit_on_top_of_the_ones_before():
    doc, md, _ = report.build([stack()], META)
    tiny = doc["upstreams"]["tiny"]
    assert doc["verdict"] == "pass", tiny["violations"]
    one, two = tiny["steps"]
    assert one["FAIL_TO_PASS"] == [KIT, F2P] and KIT2 not in one["tests"]  # a later commit's kit test: not judged
    assert two["FAIL_TO_PASS"] == [KIT2, F2P2] and set(two["PASS_TO_PASS"]) == {KIT, F2P, GUARD}
    assert tiny["FAIL_TO_PASS"] == [KIT, F2P, KIT2, F2P2]
    assert "| tiny 1/2 | 1.0 | `aaaaaaaaaaaa` | series | 2 | 1 | 0 | pass |" in md
    assert "| tiny 2/2 | 1.0 | `aaaaaaaaaaaa` | series | 2 | 3 | 0 | pass |" in md
    assert "### 2/2: Add MORE (pass)" in md and f"- `{F2P2}`: no MORE" in md
    assert "Guards kept green (PASS_TO_PASS): 3 of 3, 2 of them the FAIL_TO_PASS tests of commits 1..1." in md
    assert md.count("| stage-1 |") == 1 and "[pytest.log](stage-1/pytest.log)" in md


def test_a_later_commit_that_breaks_an_earlier_test_fails_its_own_step_only():
    doc, md, _ = report.build([stack({F2P: Result("failed", "AssertionError: VALUE is 3")})], META)
    one, two = doc["upstreams"]["tiny"]["steps"]
    assert one["verdict"] == "pass" and two["verdict"] == "fail"
    assert two["violations"] == [f"tiny 2/2 {F2P}: PASS_TO_PASS test failed after: AssertionError: VALUE is 3"]
    assert "| tiny 2/2 | 1.0 | `aaaaaaaaaaaa` | series | 2 | 3 | 1 | **FAIL** |" in md


def test_a_kit_test_marked_with_a_key_no_commit_has_is_a_violation():
    up = stack()
    up.steps[1].after[GUARD] = Result("passed", regression="tiny#typo")
    _, violations, _ = grading.judge(up)
    assert f"tiny {GUARD}: marked regression(tiny, 'typo'), a key that no [[tiny.gate.commits]] table has" \
        in violations


def test_report_says_whether_each_base_is_the_newest_release_of_the_last_make_outdated():
    """Issue 30: the base 1.0 and a newer 1.1 on record; then the base is the newest; then no record at all."""
    record = {"asked": "2026-12-03 10:00 UTC", "packages": {"tiny": {"newest": "1.1", "released": {
        "1.0": "2026-01-01", "1.1": "2026-03-01"}}}}
    newer = {**META, "releases": {"tiny": outdated.release_status(record, "tiny", "1.0")}}
    assert ("tiny 1.0 is not the newest release: tiny 1.1 (2026-03-01) is newer, as of the last `make outdated` "
            "(2026-12-03 10:00 UTC).") in report.build([upstream()], newer)[1]
    record["packages"]["tiny"]["newest"] = "1.0"
    current = {**META, "releases": {"tiny": outdated.release_status(record, "tiny", "1.0")}}
    assert "tiny 1.0 is the newest release, as of the last `make outdated` (2026-12-03 10:00 UTC)." in \
        report.build([upstream()], current)[1]
    unknown = {**META, "releases": {"tiny": outdated.release_status(None, "tiny", "1.0")}}
    assert "No `make outdated` is on record for tiny" in report.build([upstream()], unknown)[1]
