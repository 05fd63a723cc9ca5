"""scripts/launch.py and scripts/pytest_launch.py: a launch that hangs explains itself, and nothing is left running.

The scenarios block on purpose: a parent waiting for a child that waits forever, and a 2-process
``torch.distributed.run`` launch whose rank 1 never reaches the collective that rank 0 waits in (the shape of the
hang of issue 12). Each must end with the stacks of every process in the launch log, then be killed.
"""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from scripts import launch
from scripts.gate import grading
from scripts.sources import KIT_ROOT
from tests.kit.patience import patient

PARENT_AND_CHILD = '''
import subprocess, sys, threading, time

def child_blocks_here():
    threading.Thread(target=time.sleep, args=(600,), name="helper", daemon=True).start()
    threading.Event().wait()

def parent_waits_here(child):
    child.wait()

if sys.argv[1:] == ["child"]:
    print("child started", flush=True)
    child_blocks_here()
else:
    parent_waits_here(subprocess.Popen([sys.executable, __file__, "child"]))
'''

RANK_1_NEVER_ARRIVES = '''
import os, threading
import torch.distributed as dist

def rank_1_blocks_here():
    threading.Event().wait()

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} ready", flush=True)
if dist.get_rank() == 1:
    rank_1_blocks_here()
dist.barrier()
'''


def alive(pids: list[int]) -> list[int]:
    """The pids of ``pids`` that still run (zombies count as gone)."""
    return [pid for pid in pids if launch.running(pid)]


def pids_in(log: str) -> list[int]:
    return [int(line.split()[5].rstrip(":")) for line in log.splitlines() if line.startswith("--- kit: stacks of pid")]


def test_timed_out_launch_writes_every_process_stacks_then_kills_them(tmp_path):
    script = tmp_path / "blocks.py"
    script.write_text(PARENT_AND_CHILD)
    result = launch.run([sys.executable, str(script)], tmp_path / "launch.log", timeout=patient(2))
    assert result.timed_out and result.stacks == 2
    log = result.log.read_text()
    parent, child = log.split("--- kit: stacks of pid")[1:]
    assert "in parent_waits_here" in parent
    assert "in child_blocks_here" in child and "Thread 0x" in child  # the helper thread too
    assert alive(pids_in(log)) == []


def test_hung_two_process_launch_shows_where_each_rank_waits(tmp_path):
    script = tmp_path / "rank_1_never_arrives.py"
    script.write_text(RANK_1_NEVER_ARRIVES)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = launch.run(command, tmp_path / "launch.log", timeout=patient(10), cwd=tmp_path, env=env)
    log = result.log.read_text()
    assert result.timed_out, log[-2000:]
    assert "rank 0 ready" in log and "rank 1 ready" in log, log[-2000:]
    dumps = log.split("--- kit: stacks of pid")[1:]
    assert len(dumps) == result.stacks == 3  # the launcher and both ranks
    assert any("in rank_1_blocks_here" in dump for dump in dumps)
    assert any("in barrier" in dump and "rank_1_never_arrives.py" in dump for dump in dumps)
    assert alive(pids_in(log)) == []


def test_jobs_run_side_by_side_within_the_limit(tmp_path):
    code = f"import time; start = time.time(); time.sleep({patient(1)}); print(start, time.time())"
    jobs = [launch.Job([sys.executable, "-c", code], tmp_path / f"{i}.log", 60) for i in range(4)]
    results = launch.run_all(jobs, parallel=2)
    assert [r.returncode for r in results] == [0, 0, 0, 0]
    spans = [tuple(map(float, r.log.read_text().split()[-2:])) for r in results]
    running = [sum(start <= moment < end for start, end in spans) for moment, _ in spans]
    assert max(running) == 2  # side by side, never more than the limit


LAUNCHED = {
    "passes.py": "import os\nassert os.environ['FROM_THE_ENTRY'] == 'yes'\n",  # the entry's env reaches the ranks
    "asserts.py": "import os\nassert os.environ['RANK'] == '0', f\"rank {os.environ['RANK']} disagrees\"\n",
    "crashes.py": "import module_that_does_not_exist\n",
    "hangs.py": "import threading\n\ndef stuck():\n    threading.Event().wait()\n\nstuck()\n",
}


ALONE = ("import os\n\nimport pytest\n\n\ndef test_passes():\n    assert os.environ['FROM_THE_ENTRY'] == 'yes'\n\n\n"
         "def test_fails():\n    assert os.getcwd() == 'elsewhere', f'runs in {os.path.basename(os.getcwd())}'\n\n\n"
         "@pytest.mark.skip(reason='needs a GPU')\ndef test_skipped():\n    pass\n")


def test_launched_scripts_pass_fail_or_error_in_the_junit_xml(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    for name, text in LAUNCHED.items():
        (tree / name).write_text(text)
    (tree / "tests" / "alone_check.py").write_text(ALONE)
    xml, timeout = tmp_path / "junit.xml", patient(5)  # hangs.py's own; the other launches get --launch-timeout
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "scripts.pytest_launch", "-q",
               "-o", "junit_family=xunit1", f"--junitxml={xml}", f"--rootdir={tmp_path}",
               "--launch-timeout=300", f"--launch-logs={tmp_path / 'logs'}"]
    scripts = [{"script": str(tree / name), "nproc": 2, "env": {"FROM_THE_ENTRY": "yes"}} for name in LAUNCHED]
    scripts[-1]["timeout"] = timeout  # hangs.py
    command += [f"--launch={json.dumps(entry)}" for entry in scripts]
    entries = [{"pytest": f"{tree}/tests/alone_check.py::{test}", "env": {"FROM_THE_ENTRY": "yes"}}
               for test in ("test_passes", "test_fails", "test_skipped")]
    command += [f"--launch={json.dumps(entry)}" for entry in entries]
    env = {**os.environ, "PYTHONPATH": str(KIT_ROOT), "OMP_NUM_THREADS": "1"}
    result = launch.run(command, tmp_path / "pytest.log", timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 1, result.tail()
    results = grading.read_junit(xml)
    alone = "tree/tests/alone_check.py::"
    assert {key: r.outcome for key, r in results.items()} == {
        "tree/passes.py": "passed", "tree/asserts.py": "failed", "tree/crashes.py": "error", "tree/hangs.py": "error",
        f"{alone}test_passes": "passed", f"{alone}test_fails": "failed", f"{alone}test_skipped": "skipped"}
    assert results["tree/asserts.py"].message.startswith("AssertionError: rank 1 disagrees")
    # a pytest node runs alone, from the directory above its tests/
    assert results[f"{alone}test_fails"].message.startswith("AssertionError: runs in tree"), results
    assert grading.is_assertion(results[f"{alone}test_fails"].message)
    assert grading.is_assertion(results["tree/asserts.py"].message)
    assert f"timed out after {timeout:.0f} s" in results["tree/hangs.py"].message
    hang_log = (tmp_path / "logs" / "hangs.py.log").read_text()
    assert hang_log.count("in stuck") == 2  # both ranks' stacks
    root = ET.parse(xml).getroot()
    assert root.find(".//testcase").get("file").startswith("tree/")
    assert "exit status 1 without an AssertionError" in results["tree/crashes.py"].message


def test_a_malformed_launch_entry_is_one_line(tmp_path):
    """A --launch value that is not an entry (a string, a list, a node id without a tests/ directory, both kinds at
    once) stops pytest with one usage error line, not a traceback."""
    (tmp_path / "check.py").write_text("def test_x():\n    pass\n")
    for value in ['"abc"', "[1]", '{"pytest": 5}', json.dumps({"pytest": f"{tmp_path}/check.py::test_x"}),
                  json.dumps({"pytest": f"{tmp_path}/check.py::test_x", "script": f"{tmp_path}/check.py"})]:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "scripts.pytest_launch", "-q",
                   f"--rootdir={tmp_path}", f"--launch={value}", f"--launch-logs={tmp_path / 'logs'}"]
        result = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(KIT_ROOT)},
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 4, (value, result.stdout[-500:], result.stderr[-500:])
        assert "Traceback" not in result.stderr + result.stdout, (value, result.stderr[-800:])
        assert result.stderr.startswith("ERROR: --launch takes a JSON object"), (value, result.stderr[-500:])
