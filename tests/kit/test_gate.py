"""The gate on a tiny upstream: it passes a good series and rejects sabotaged ones, naming the violation.

The tiny upstream's bug: ``tiny.VALUE`` is 1 and should be 2. The good series fixes it and adds the upstream
test ``tests/test_fixed.py`` (declared FAIL_TO_PASS in sources.toml); the kit's suite for it holds one
``regression`` test and one guard. Each sabotage breaks one part of the contract.
"""

import json

import pytest

from scripts import KitError, gate
from scripts.checkout import git

UPSTREAM_TEST = "def test_value_is_two():\n    import tiny\n\n    assert tiny.VALUE == 2\n"
KIT_SUITE = '''import pytest

import tiny


{marker}
def test_value_is_fixed():
    assert tiny.VALUE == {expected}


def test_value_is_known():
    {guard}
'''
KIT_TEST = "suites/tiny/test_tiny_kit.py"  # node ids are relative to the parent of --suites
UPSTREAM_ID = "upstream/tiny/tests/test_fixed.py"  # upstream tests: upstream/<name>/ + their id in its tree
GOOD = {"expected": "2", "guard": "assert tiny.VALUE in (1, 2)"}


def make_series(kit, fix: bool) -> None:
    """Commit the upstream test (and the fix when ``fix``) in the tiny checkout and export the series."""
    assert kit.run("apply")[0] == 0
    if fix:
        (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")
    (kit.repo / "tests" / "test_fixed.py").write_text(UPSTREAM_TEST)
    git(kit.repo, "add", "--all")
    git(kit.repo, "-c", "user.name=A U Thor", "-c", "user.email=author@example.com", "commit", "--quiet",
        "--signoff", "--message", "Set VALUE to 2\n\nFixes #1")
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0


def run_gate(kit, monkeypatch, capsys, suite: dict, marker: str = '@pytest.mark.regression("tiny", 1)',
             report: bool = True) -> tuple[int, dict, str]:
    """Run the gate on the tiny kit with the kit suite ``suite`` (its regression test marked with ``marker``);
    return (exit code, report.json or {} when ``report`` is False, stdout)."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() +
                                           '[tiny.gate]\nupstream_tests = ["tests/test_fixed.py"]\n'
                                           'fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]\n')
    (kit.root / "suites" / "tiny").mkdir(parents=True)
    (kit.root / "suites" / "tiny" / "test_tiny_kit.py").write_text(KIT_SUITE.format(marker=marker, **suite))
    monkeypatch.setenv("PYTHONPATH", str(kit.repo))
    capsys.readouterr()
    code = gate.main([f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
                      f"--patches={kit.root / 'patches'}", f"--suites={kit.root / 'suites'}",
                      f"--out={kit.root / 'out'}", "--jobs=0"])
    document = json.loads((kit.root / "out" / "report.json").read_text()) if report else {}
    return code, document, capsys.readouterr().out


def test_good_series_passes_and_is_left_applied(kit, monkeypatch, capsys):
    make_series(kit, fix=True)
    code, report, out = run_gate(kit, monkeypatch, capsys, GOOD)
    assert code == 0, out
    tiny = report["upstreams"]["tiny"]
    assert tiny["FAIL_TO_PASS"] == [f"{KIT_TEST}::test_value_is_fixed", f"{UPSTREAM_ID}::test_value_is_two"]
    assert tiny["PASS_TO_PASS"] == [f"{KIT_TEST}::test_value_is_known"]
    assert tiny["tests"][f"{UPSTREAM_ID}::test_value_is_two"] == {
        "contract": "FAIL_TO_PASS", "before": "failed", "after": "passed", "ok": True}
    assert (kit.repo / "tiny" / "__init__.py").read_text() == "VALUE = 2\n"
    assert f"| `{UPSTREAM_ID}::test_value_is_two` | FAIL_TO_PASS | failed | passed | yes |" in (
        kit.root / "out" / "report.md").read_text()


@pytest.mark.parametrize("fix, suite, violation", [
    (False, GOOD, f"{UPSTREAM_ID}::test_value_is_two: FAIL_TO_PASS test failed after the series"),
    (False, GOOD, f"{KIT_TEST}::test_value_is_fixed: FAIL_TO_PASS test failed after the series"),
    (True, {**GOOD, "expected": "tiny.VALUE"},
     f"{KIT_TEST}::test_value_is_fixed: FAIL_TO_PASS test passed before the series"),
    (True, {**GOOD, "guard": "pytest.skip('no reason')"}, f"{KIT_TEST}::test_value_is_known: skipped before"),
    (True, {**GOOD, "guard": "assert tiny.VALUE == 2"}, f"{KIT_TEST}::test_value_is_known: PASS_TO_PASS test "
     "failed before"),
    (True, {**GOOD, "expected": "2 if tiny.VALUE == 2 else tiny.missing"},
     f"{KIT_TEST}::test_value_is_fixed: FAIL_TO_PASS test failed before without an assertion"),
], ids=["fix-hunks-removed-upstream-test", "fix-hunks-removed-kit-test", "regression-passes-on-base",
        "skip", "guard-fails", "not-an-assertion"])
def test_sabotaged_series_is_rejected(kit, monkeypatch, capsys, fix, suite, violation):
    make_series(kit, fix=fix)
    code, report, out = run_gate(kit, monkeypatch, capsys, suite)
    assert code == 1
    assert report["verdict"] == "fail"
    assert any(v.startswith(f"tiny {violation}") for v in report["upstreams"]["tiny"]["violations"]), out
    assert f"violation: tiny {violation}" in out


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
    assert gate.is_assertion(message) is expected


def test_gate_without_regression_tests_fails(kit, monkeypatch, capsys):
    make_series(kit, fix=True)
    suite = {"expected": "2", "guard": "assert tiny.VALUE in (1, 2)"}
    code, report, out = run_gate(kit, monkeypatch, capsys, suite, marker="")
    assert code == 1
    assert "tiny: no FAIL_TO_PASS test in the kit's suite (no test marked `regression` ran)" in out


def test_gate_stopped_by_an_error_puts_the_series_back(kit, monkeypatch, capsys):
    make_series(kit, fix=True)
    assert kit.run("apply")[0] == 0
    applied = git(kit.repo, "rev-parse", "HEAD").stdout
    def stop(path):
        raise KitError(f"{path}: stopped by the test")

    monkeypatch.setattr(gate, "read_junit", stop)
    code, _, _ = run_gate(kit, monkeypatch, capsys, GOOD, report=False)
    assert code == 1
    assert git(kit.repo, "symbolic-ref", "--short", "HEAD").stdout.strip() == "series/1.0"
    assert git(kit.repo, "rev-parse", "HEAD").stdout == applied
