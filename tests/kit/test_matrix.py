"""The matrix on a tiny upstream: a release that meets what it declares passes; one that does not makes the matrix
exit 1 naming it; the user's checkout is never switched.

The tiny upstream, its series and its kit suite are those of tests/kit/test_gate.py (``tiny.VALUE`` is 1 and should
be 2). The matrix runs the real gate (``python -m scripts.gate``) as a child process, with this Python.
"""

import json
import subprocess
import threading
import time
from pathlib import Path

from scripts import matrix
from scripts.git import git, rev
from tests.kit.test_gate import GOOD, KIT_SUITE, make_series

GATE = ('[tiny.gate]\nupstream_tests = ["tests/test_fixed.py"]\n'
        'fail_to_pass = ["tests/test_fixed.py::test_value_is_two"]\n')


def write_kit(kit) -> None:
    """The gate table and the kit suite of the tiny kit."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + GATE)
    (kit.root / "suites" / "tiny").mkdir(parents=True)
    (kit.root / "suites" / "tiny" / "test_tiny_kit.py").write_text(
        KIT_SUITE.format(marker='@pytest.mark.regression("tiny", 1)', **GOOD))


def matrix_main(kit, capsys, *options: str) -> tuple[int, str, str]:
    """Run the matrix's command line on the tiny kit with ``options``; return (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = matrix.main([f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
                        f"--patches={kit.root / 'patches'}", f"--suites={kit.root / 'suites'}",
                        f"--cache={kit.cache}", f"--out={kit.root / 'matrix'}", "--jobs=1",
                        f"--pip-options=--no-index --find-links {kit.index} --no-build-isolation", *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_matrix(kit, capsys) -> tuple[int, dict, str, str]:
    """Run the matrix on the tiny kit; return (exit code, report.json, stdout, stderr)."""
    write_kit(kit)
    code, out, err = matrix_main(kit, capsys)
    return code, json.loads((kit.root / "matrix" / "report.json").read_text()), out, err


def test_one_row_writes_its_record_and_collect_makes_the_report(kit, capsys):
    """make matrix ROW=<id> (one job of the workflow's strategy.matrix) gates one row and writes its record; the
    collect job makes the report from the records; the row list is what --list-rows prints."""
    make_series(kit, fix=True)
    write_kit(kit)
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text()
                                           + '[tiny.torch_axis]\nversions = ["9.9"]\n')
    code, out, _ = matrix_main(kit, capsys, "--list-rows")
    assert code == 0 and json.loads(out) == ["tiny-1.0", "tiny-1.0-torch-9.9"]
    code, out, err = matrix_main(kit, capsys, "--row", "tiny-1.0")
    assert code == 0, out + err
    record = json.loads((kit.root / "matrix" / "tiny-1.0" / "row.json").read_text())
    assert (record["gate"], record["meets"], record["FAIL_TO_PASS"]) == ("pass", True, 2)
    assert not (kit.root / "matrix" / "report.json").exists()
    code, out, err = matrix_main(kit, capsys, "--collect")
    assert code == 1 and "matrix: tiny 1.0 with torch 9.9 does not meet its declaration" in err
    report = json.loads((kit.root / "matrix" / "report.json").read_text())
    assert [(r["dependency"], r["gate"]) for r in report["rows"]] == [("", "pass"), ("torch 9.9", "no record")]
    assert "| tiny | 1.0 | - | kit | series | series | pass | 2 | 1 |" in out
    code, _, err = matrix_main(kit, capsys, "--row", "tiny-2.0")
    assert code == 1 and "ROW=tiny-2.0 is not a row of the matrix" in err


def test_release_that_meets_its_declaration_passes_and_the_checkout_stays(kit, capsys):
    make_series(kit, fix=True)
    before = (rev(kit.repo), git(kit.repo, "status", "--porcelain").stdout)
    code, report, out, err = run_matrix(kit, capsys)
    assert code == 0, out + err
    [row] = report["rows"]
    assert (row["upstream"], row["release"], row["declared"], row["check"], row["gate"], row["meets"]) == (
        "tiny", "1.0", "series", "series", "pass", True)
    assert (row["FAIL_TO_PASS"], row["PASS_TO_PASS"]) == (2, 1)
    table = (kit.root / "matrix" / "report.md").read_text()
    assert "| tiny | 1.0 | - | kit | series | series | pass | 2 | 1 |" in table
    assert (rev(kit.repo), git(kit.repo, "status", "--porcelain").stdout) == before


def test_release_that_fails_its_declaration_exits_1_naming_it(kit, capsys):
    make_series(kit, fix=False)  # the series holds the upstream test but not the fix
    code, report, out, err = run_matrix(kit, capsys)
    assert code == 1
    assert report["verdict"] == "fail" and report["failing"] == ["tiny 1.0"]
    [row] = report["rows"]
    assert row["gate"] == "fail" and not row["meets"]
    assert any("FAIL_TO_PASS test failed after the series" in note for note in row["notes"])
    assert "matrix: tiny 1.0 does not meet its declaration" in err
    assert "| tiny | 1.0 | - | kit | series | series | fail | 2 | 1 |" in out


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_stop_that_comes_while_a_command_starts_still_kills_it(tmp_path, monkeypatch):
    """``stop()`` between the start of a command and its registration as running: the command is killed, not left
    to run until its timeout (under load, the test above once saw the stop before the registration)."""
    runner, real_popen = matrix.Runner(), subprocess.Popen

    def popen_then_stop(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        stopper = threading.Thread(target=runner.stop)
        stopper.start()
        stopper.join(timeout=0.5)  # the stop arrives now, before run() has registered the command
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen_then_stop)
    thread = threading.Thread(target=runner.run, args=(["sleep", "300"], tmp_path / "log"))
    thread.start()
    thread.join(timeout=10)
    monkeypatch.undo()
    if thread.is_alive():
        runner.stop()  # what a fixed Runner did by itself: the test leaves no sleep behind
    assert not thread.is_alive(), "a command that started as the matrix was stopped kept running"


def test_stop_kills_every_running_command_and_what_it_started(tmp_path):
    runner = matrix.Runner()
    pids = tmp_path / "pids"
    # A command that starts a child in a session of its own, as torch.distributed.run does with its ranks.
    script = f"setsid sleep 300 & echo $! > {pids}; sleep 300"
    thread = threading.Thread(target=runner.run, args=(["sh", "-c", script], tmp_path / "log"))
    thread.start()
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    [child] = [int(pids.read_text())]
    runner.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not alive(child)
    assert runner.run(["true"], tmp_path / "log") is None  # nothing new starts once stopped
