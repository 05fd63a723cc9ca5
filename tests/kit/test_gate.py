"""The gate on a tiny upstream: it passes a good series and rejects sabotaged ones, naming the violation; it never
writes the checkout, survives a SIGKILL, honours a release's declared check, and runs launched upstream scripts.

The tiny upstream's bug: ``tiny.VALUE`` is 1 and should be 2. The good series fixes it and adds the upstream
test ``tests/test_fixed.py`` (declared FAIL_TO_PASS in sources.toml); the kit's suite for it holds one
``regression`` test and one guard. Each sabotage breaks one part of the contract.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts import gate, worktree
from scripts.git import git
from scripts.sources import KIT_ROOT
from tests.kit.patience import patient

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
GATE_TABLE = ('[tiny.gate]\nupstream_tests = ["tests/test_fixed.py"]\n'
              'fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]\n')


def commit(repo, message="Set VALUE to 2\n\nFixes #1"):
    git(repo, "add", "--all")
    git(repo, "-c", "user.name=A U Thor", "-c", "user.email=author@example.com", "commit", "--quiet", "--signoff",
        "--message", message)


def make_series(kit, fix: bool, extra: dict | None = None) -> None:
    """Commit the upstream test (the fix when ``fix``; files ``extra`` {path: text}) in the tiny checkout and
    export the series; the checkout is left on its base."""
    assert kit.run("apply")[0] == 0
    if fix:
        (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")
    (kit.repo / "tests" / "test_fixed.py").write_text(UPSTREAM_TEST)
    for path, text in (extra or {}).items():
        (kit.repo / path).parent.mkdir(parents=True, exist_ok=True)
        (kit.repo / path).write_text(text)
    commit(kit.repo)
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0


def write_kit(kit, suite: dict, marker: str = '@pytest.mark.regression("tiny", 1)', table: str = GATE_TABLE) -> list:
    """Add ``table`` to sources.toml and write the kit suite; return the gate's command-line options."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + table)
    (kit.root / "suites" / "tiny").mkdir(parents=True, exist_ok=True)
    (kit.root / "suites" / "tiny" / "test_tiny_kit.py").write_text(KIT_SUITE.format(marker=marker, **suite))
    return [f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
            f"--patches={kit.root / 'patches'}", f"--suites={kit.root / 'suites'}", f"--out={kit.root / 'out'}"]


def run_gate(kit, capsys, suite: dict, **options) -> tuple[int, dict, str]:
    """Run the gate on the tiny kit; return (exit code, report.json, stdout)."""
    argv = write_kit(kit, suite, **options)
    capsys.readouterr()
    code = gate.main(argv)
    report = kit.root / "out" / "report.json"
    return code, json.loads(report.read_text()) if report.exists() else {}, capsys.readouterr().out


def state(repo) -> tuple:
    """What the user sees of a checkout: HEAD, its branch, status, refs, and the file contents of the work tree."""
    files = {p.relative_to(repo).as_posix(): p.read_bytes() for p in sorted(repo.rglob("*"))
             if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts}
    return (git(repo, "rev-parse", "HEAD").stdout, git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout,
            git(repo, "status", "--porcelain").stdout, git(repo, "for-each-ref").stdout, files)


def test_good_series_passes_and_the_checkout_is_not_touched(kit, capsys):
    make_series(kit, fix=True)
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 7  # the user's uncommitted edit\n")
    before = state(kit.repo)
    code, report, out = run_gate(kit, capsys, GOOD)
    assert code == 0, out
    assert state(kit.repo) == before
    assert worktree.listed(kit.repo) == []
    tiny = report["upstreams"]["tiny"]
    assert tiny["FAIL_TO_PASS"] == [f"{KIT_TEST}::test_value_is_fixed", f"{UPSTREAM_ID}::test_value_is_two"]
    assert tiny["PASS_TO_PASS"] == [f"{KIT_TEST}::test_value_is_known"]
    assert tiny["tests"][f"{UPSTREAM_ID}::test_value_is_two"] == {
        "contract": "FAIL_TO_PASS", "before": "failed", "after": "passed", "ok": True, "reason": "1 == 2"}
    assert tiny["check"] == "series" and tiny["version"] == "1.0"
    assert tiny["base"] == git(kit.repo, "rev-parse", "base/1.0").stdout.strip()
    for stage in ("before", "after"):
        assert tiny["imports"][stage]["outside"] == [] and tiny["imports"][stage]["processes"] >= 1
    assert set(report["versions"]) == {"python", "torch", "torchdata", "numpy"}
    md = (kit.root / "out" / "report.md").read_text()
    assert md.index("| tiny | 1.0 |") < md.index("<details>")
    assert f"| `{UPSTREAM_ID}::test_value_is_two` | FAIL_TO_PASS | failed: 1 == 2 | passed | yes |" in md


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
def test_sabotaged_series_is_rejected(kit, capsys, fix, suite, violation):
    make_series(kit, fix=fix)
    code, report, out = run_gate(kit, capsys, suite)
    assert code == 1
    assert report["verdict"] == "fail"
    violations = report["upstreams"]["tiny"]["violations"]
    assert any(v.startswith(f"tiny {violation}") for v in violations), out
    assert f"violation: tiny {violation}" in out
    key = violation.split(": ")[0]
    excerpt = report["upstreams"]["tiny"]["tests"][key]["excerpt"]
    assert (kit.root / "out" / excerpt).read_text().startswith(key)
    assert f"([log excerpt]({excerpt}))" in (kit.root / "out" / "report.md").read_text()


def test_gate_without_regression_tests_fails(kit, capsys):
    make_series(kit, fix=True)
    code, report, out = run_gate(kit, capsys, GOOD, marker="")
    assert code == 1
    assert "tiny: no FAIL_TO_PASS test in the kit's suite (no test marked `regression` ran)" in out


def test_stage_tree_never_serves_bytecode_of_a_same_sized_file_written_within_one_second(kit):
    """The stale-bytecode verdict of issue 12: a ``.pyc`` is trusted when the source's mtime (in seconds) and size
    match. A stage tree made again at the same path must import the new source, not the old tree's bytecode."""
    assert kit.run("apply")[0] == 0
    first = git(kit.repo, "rev-parse", "HEAD").stdout.strip()
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")  # same size as "VALUE = 1\n"
    commit(kit.repo)
    second = git(kit.repo, "rev-parse", "HEAD").stdout.strip()
    tree = kit.root / "out" / "trees" / "after" / "tiny"
    source = tree / "tiny" / "__init__.py"

    def value() -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHE"))}
        env["PYTHONPATH"] = str(tree)
        return subprocess.run([sys.executable, "-c", "import tiny; print(tiny.VALUE)"], env=env, cwd=kit.root,
                              capture_output=True, text=True, check=True).stdout.strip()

    worktree.add(kit.repo, tree, first)
    assert value() == "1" and list((tree / "tiny" / "__pycache__").glob("*.pyc"))
    written = source.stat().st_mtime_ns
    worktree.add(kit.repo, tree, second)
    os.utime(source, ns=(written, written))  # as if written within the same second as the first version
    assert value() == "2"
    worktree.clean(kit.repo, kit.root / "out" / "trees")
    assert worktree.listed(kit.repo) == []


def test_sigkill_in_the_middle_of_a_stage_leaves_the_checkout_as_it_was(kit, capsys):
    """SIGKILL the gate while a stage runs: the checkout is byte for byte as before, and the next gate passes."""
    make_series(kit, fix=True)
    assert kit.run("apply")[0] == 0
    mark = kit.root / "in-the-stage"
    argv = write_kit(kit, SLEEPING_GUARD)
    before = state(kit.repo)
    env = {**os.environ, "TINY_MARK": str(mark), "PYTHONPATH": str(KIT_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "scripts.gate", *argv], cwd=KIT_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "the gate ended before its stage reached the sleeping test"
        time.sleep(0.1)
    assert (kit.root / "out" / "trees" / "after" / "tiny").is_dir()  # the gate is in the middle of a stage
    assert worktree.listed(kit.repo) == []  # and its trees are not work trees of the checkout (issue 22)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert state(kit.repo) == before
    code, report, out = run_gate(kit, capsys, GOOD, table="")
    assert code == 0, out
    assert state(kit.repo) == before
    assert worktree.listed(kit.repo) == []


def corrupt_test_hunk(kit) -> None:
    """Make the series' hunk of the existing upstream test file not apply (as on a release where that file
    differs), leaving its fix hunk intact."""
    patch = next((kit.patches).glob("*.patch"))
    text = patch.read_text()
    assert "\n def test_value():\n" in text
    patch.write_text(text.replace("\n def test_value():\n", "\n def test_value_in_this_release():\n", 1))


EDITED_TEST = "import tiny\n\n\ndef test_value():\n    assert tiny.VALUE == 2\n"


@pytest.mark.parametrize("check, code", [("series", 1), ("fix", 0)])
def test_a_release_declaring_the_fix_check_skips_test_files_that_do_not_apply(kit, capsys, check, code):
    make_series(kit, fix=True, extra={"tests/test_tiny.py": EDITED_TEST})
    corrupt_test_hunk(kit)
    declaration = f'check = "{check}"\nreason = "tests/test_tiny.py differs in this release"\n'
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text().replace(
        '[tiny.releases."1.0"]\n', '[tiny.releases."1.0"]\n' + declaration))
    table = GATE_TABLE.replace('["tests/test_fixed.py"]', '["tests/test_fixed.py", "tests/test_tiny.py"]', 1)
    result, report, out = run_gate(kit, capsys, GOOD, table=table)
    assert result == code, out
    tiny = report["upstreams"]["tiny"]
    assert tiny["check"] == check
    if check == "series":
        assert any("the series does not apply to 1.0" in v and "tests/test_tiny.py" in v
                   for v in tiny["violations"]), out
    else:
        assert tiny["skipped_upstream_tests"] == ["tests/test_tiny.py"]
        assert tiny["FAIL_TO_PASS"] == [f"{KIT_TEST}::test_value_is_fixed", f"{UPSTREAM_ID}::test_value_is_two"]
        assert not any("test_tiny.py" in key for key in tiny["tests"])
        md = (kit.root / "out" / "report.md").read_text()
        assert "**fix only** (tests/test_tiny.py differs in this release)" in md and "`tests/test_tiny.py`" in md


def test_a_release_declaring_the_fix_check_fails_when_the_fix_does_not_fix(kit, capsys):
    make_series(kit, fix=False)
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text().replace(
        '[tiny.releases."1.0"]\n', '[tiny.releases."1.0"]\ncheck = "fix"\nreason = "a test"\n'))
    code, report, out = run_gate(kit, capsys, GOOD)
    assert code == 1
    assert f"violation: tiny {KIT_TEST}::test_value_is_fixed: FAIL_TO_PASS test failed after the series" in out


LAUNCHED = '''import os

import tiny

assert tiny.VALUE == 2, f"rank {os.environ['RANK']}: VALUE is {tiny.VALUE}"
'''


def test_launched_upstream_script_is_a_fail_to_pass_test(kit, capsys):
    script = "tiny/scripts/check_value.py"
    make_series(kit, fix=True, extra={script: LAUNCHED})
    table = GATE_TABLE.replace("fail_to_pass = [", f'launch = [{{ script = "{script}", nproc = 2 }}]\n'
                                                   f'fail_to_pass = ["{script}", ', 1)
    code, report, out = run_gate(kit, capsys, GOOD, table=table)
    assert code == 0, out
    row = report["upstreams"]["tiny"]["tests"][f"upstream/tiny/{script}"]
    assert row["contract"] == "FAIL_TO_PASS" and row["after"] == "passed"
    assert row["before"] == "failed" and row["reason"].startswith("rank ") and "VALUE is 1" in row["reason"]


SLEEPING_GUARD = {**GOOD, "guard": "assert tiny.VALUE in (1, 2)\n    if 'TINY_MARK' in __import__('os').environ:\n"
                                   "        open(__import__('os').environ['TINY_MARK'], 'w')\n"
                                   "        __import__('time').sleep(60)"}


def test_a_stage_that_hangs_is_killed_with_its_stacks_in_the_report(kit, capsys, monkeypatch):
    make_series(kit, fix=True)
    monkeypatch.setenv("TINY_MARK", str(kit.root / "in-the-stage"))
    argv = write_kit(kit, SLEEPING_GUARD)
    capsys.readouterr()
    timeout = patient(3)
    assert gate.main([*argv, f"--timeout={timeout}"]) == 1
    report = json.loads((kit.root / "out" / "report.json").read_text())
    violations = report["upstreams"]["tiny"]["violations"]
    assert any(f"the before stage timed out after {timeout:.0f} s" in v for v in violations), violations
    assert "stacks/before-pytest.log" in report["stacks"]
    stacks = (kit.root / "out" / "stacks" / "before-pytest.log").read_text()
    assert "in test_value_is_known" in stacks
    assert worktree.listed(kit.repo) == []


def test_out_outside_the_kit_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gate.parse_args([f"--out={tmp_path}"])
    assert "must lie inside" in capsys.readouterr().err
