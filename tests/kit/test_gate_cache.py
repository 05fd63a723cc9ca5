"""Stage results reused by content (scripts/gate/cache.py, issue 42), on the tiny upstream of test_gate.py.

A gate run again with nothing changed reuses every stage and judges the same; each input of a stage's key, changed in
turn, makes the stages it feeds run again (a change to the fix alone: only the after stage); ``--no-cache`` runs
every stage; a stage whose failures were not the expected ones is not kept.
"""

import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from scripts import cache as reuse
from scripts import gate
from scripts.gate import cache
from scripts.sources import KIT_ROOT
from tests.kit.test_gate import GOOD, commit, make_series, write_kit

# The upstream test as a launched pytest entry (an ``env`` can be added to it); adding the same file to
# ``upstream_tests`` later changes what the stages run, not the tests' outcomes.
LAUNCHED_TABLE = ('[tiny.gate]\nlaunch = [{ pytest = "tests/test_fixed.py::test_value_is_two" }]\n'
                  'fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]\n')
UPSTREAM_TESTS = '[tiny.gate]\nupstream_tests = ["tests/test_fixed.py"]\n'


def run(kit, capsys, argv: list[str]) -> tuple[dict, str]:
    """Run the gate; return ({stage: the run its results came from, '' when it ran now}, stdout). The gate must
    pass: a reused result must judge as the run that made it."""
    capsys.readouterr()
    code = gate.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((kit.root / "out" / "report.json").read_text())
    stages = report["upstreams"]["tiny"]["stages"]
    assert report["upstreams"]["tiny"]["FAIL_TO_PASS"] and report["upstreams"]["tiny"]["PASS_TO_PASS"]
    return {stage: entry["reused"] for stage, entry in stages.items()}, out


def amend_fix(kit, text: str) -> None:
    """Change the fix of the tiny series to ``text`` (tiny/__init__.py) and export it again."""
    assert kit.run("apply")[0] == 0
    (kit.repo / "tiny" / "__init__.py").write_text(text)
    commit(kit.repo, message="Set VALUE to 2 (again)\n\nFixes #1")
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0


class FakeDistribution(metadata.Distribution):
    """One more installed distribution, as if pip had installed a package into the venv."""

    def read_text(self, filename):
        return "Metadata-Version: 2.1\nName: kit-cache-probe\nVersion: 1.0\n" if filename == "METADATA" else None

    def locate_file(self, path):
        return path


def test_a_stage_runs_again_exactly_when_an_input_of_its_key_changes(kit, capsys, monkeypatch, tmp_path):
    make_series(kit, fix=True)
    argv = write_kit(kit, GOOD, table=LAUNCHED_TABLE)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("numpy==2.3.5\n")
    monkeypatch.setattr(reuse, "CONSTRAINTS", constraints)
    code = tmp_path / "gate-code"
    (code / "gate").mkdir(parents=True)
    (code / "gate" / "stages.py").write_text("# the gate's code\n")
    monkeypatch.setattr(cache, "GATE_CODE", code)
    monkeypatch.setattr(cache, "STAGE_CODE", ("gate",))

    cold, _ = run(kit, capsys, argv)
    assert cold == {"before": "", "after": ""}
    warm, out = run(kit, capsys, argv)
    assert set(warm) == {"before", "after"} and all(warm.values()), out
    assert "gate: every stage's results are reused" in out
    md = (kit.root / "out" / "report.md").read_text()
    assert f"tiny: reused from the run of {warm['before']}" in md and "../gate-cache/" in md

    def touched_fix():
        amend_fix(kit, "VALUE = 2  # the one-line change\n")

    def suite():
        path = kit.root / "suites" / "tiny" / "test_tiny_kit.py"
        path.write_text(path.read_text() + "\n# a comment\n")

    def beside_suite():
        (kit.root / "suites" / "conftest.py").write_text("# the suites' conftest\n")

    def pyproject():
        (kit.root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")

    def launch_entries():
        table = (kit.root / "sources.toml").read_text()
        (kit.root / "sources.toml").write_text(table.replace(" }]", ', env = { TINY_PROBE = "1" } }]'))

    def upstream_tests():
        table = (kit.root / "sources.toml").read_text()
        (kit.root / "sources.toml").write_text(table.replace("[tiny.gate]\n", UPSTREAM_TESTS))

    def lock():
        constraints.write_text("numpy==2.3.4\n")

    def distributions():
        found = metadata.distributions
        monkeypatch.setattr(metadata, "distributions", lambda: [*found(), FakeDistribution()])

    def python():
        monkeypatch.setattr(sys, "version", sys.version + " (another build)")

    def torch():
        real = metadata.version
        monkeypatch.setattr(metadata, "version", lambda name: "2.14.1" if name == "torch" else real(name))

    def gate_code():
        (code / "gate" / "stages.py").write_text("# the gate's code, changed\n")

    changes = [(touched_fix, {"after"}), (suite, {"before", "after"}), (beside_suite, {"before", "after"}),
               (pyproject, {"before", "after"}), (launch_entries, {"before", "after"}),
               (upstream_tests, {"before", "after"}), (lock, {"before", "after"}),
               (distributions, {"before", "after"}), (python, {"before", "after"}), (torch, {"before", "after"}),
               (gate_code, {"before", "after"})]
    for change, again in changes:
        change()
        reused, out = run(kit, capsys, argv)
        assert {stage for stage, run_id in reused.items() if not run_id} == again, (change.__name__, out)
    reused, out = run(kit, capsys, argv)
    assert all(reused.values()), ("not reused once stored", out)

    ran, out = run(kit, capsys, [*argv, "--no-cache"])
    assert ran == {"before": "", "after": ""}, out


def test_a_stage_with_unexpected_failures_is_not_kept(kit, capsys):
    make_series(kit, fix=True)
    argv = write_kit(kit, {**GOOD, "guard": "assert tiny.VALUE == 2"})  # a guard that fails before the fix
    for _ in range(2):
        capsys.readouterr()
        assert gate.main(argv) == 1
        stages = json.loads((kit.root / "out" / "report.json").read_text())["upstreams"]["tiny"]["stages"]
        assert stages["before"]["reused"] == "", "a stage that failed tests it should not was reused"
    assert stages["after"]["reused"], "the after stage, whose failures were none, was not kept"


def test_the_key_is_the_hash_of_every_input():
    inputs = {"tree": "a" * 40, "suite": "b" * 64, "launches": [{"pytest": "tests/test_x.py::test"}]}
    assert reuse.key(inputs) == hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    assert all(reuse.key({**inputs, name: "changed"}) != reuse.key(inputs) for name in inputs)


def test_the_gate_code_in_the_key_holds_every_scripts_module_the_stages_import():
    """What a stage runs of the kit: the gate's package, which makes the trees and launches the stage, the pytest
    plugins of the stage's process and sitecustomize; every scripts module they import must be in STAGE_CODE, so that
    a change to it changes the key. (In a fresh interpreter: the test's own imports do not count.)"""
    plugins = "scripts.gate, scripts.pytest_launch, scripts.pytest_progress, scripts.pytest_regression"
    probe = (f"import sys, {plugins}; sys.path.insert(0, 'scripts/launch_site'); import sitecustomize; "
             "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'scripts'))")
    imported = subprocess.run([sys.executable, "-c", probe], cwd=KIT_ROOT, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(KIT_ROOT)}).stdout.split()
    hashed = {path.resolve() for path in cache.gate_code_files()}
    missing = {Path(f).resolve() for f in imported} - hashed
    assert imported and not missing, sorted(map(str, missing))
    assert (KIT_ROOT / "scripts" / "launch_site" / "sitecustomize.py").resolve() in hashed
    assert not any("bench" in p.parts or p.name in ("matrix.py", "lint.py", "pr.py") for p in hashed)
