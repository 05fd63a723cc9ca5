"""tests/rank_worker.py: a scenario that raises on one rank ends the launch at once, not at its timeout.

Here rank 0 raises in the first scenario and rank 1 goes on to a barrier rank 0 never reaches. (The gate run on
accelerate 1.13.0 that prompted this was another case: a DataLoader worker deadlocked at fork, rank 0 waited for it
until the 600 s timeout, and the worker's SIGUSR1 stack dump then crashed it, so rank 0 recorded "killed by signal:
Segmentation fault" only while the launch was being stopped; see the last test.)
"""

import json
import os
import sys

import pytest

from scripts import launch
from scripts.sources import KIT_ROOT
from tests.kit.test_launch import alive
from tests.launched import rank_results

WORKER = """
import subprocess, sys
import torch.distributed as dist
sys.path.insert(0, {root!r})
from tests.rank_worker import run_scenarios

def call(name):
    if name == "raises" and dist.get_rank() == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as a DataLoader worker
        open(sys.argv[1] + "/child.pid", "w").write(str(child.pid))
        raise RuntimeError("rank 0 fails here")
    dist.barrier()  # rank 1 waits here for rank 0
    return {{"done": True}}

dist.init_process_group("gloo")
run_scenarios(sys.argv[1], ["raises", "later"], dist.get_rank(), call, world_size=dist.get_world_size())
"""
TIMEOUT = 120  # s; the launch must end long before


def test_a_raising_scenario_ends_the_launch(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(root=str(KIT_ROOT)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    result = launch.run([*cmd, str(tmp_path)], tmp_path / "launch.log", TIMEOUT, cwd=tmp_path)

    log = (tmp_path / "launch.log").read_text(errors="replace")
    assert not result.timed_out, f"the launch waited for its timeout:\n{log[-3000:]}"
    assert result.returncode != 0
    assert result.seconds < TIMEOUT / 2, result.seconds
    error = json.loads((tmp_path / "raises.rank0.json").read_text())
    assert "rank 0 fails here" in error["error"] and error["rank"] == 0
    assert "scenario 'raises' raised; ending the launch" in log
    child = int((tmp_path / "child.pid").read_text())
    assert alive([child]) == [], "the raising rank's child process outlived the launch"
    assert not (tmp_path / "later.rank0.json").exists()
    for path in tmp_path.glob("*.rank1.json"):  # rank 1 is stopped, or its barrier fails as rank 0 is gone
        assert "done" not in json.loads(path.read_text()), f"rank 1 passed a barrier rank 0 never joined: {path.name}"
    (tmp_path / "launch.json").write_text(json.dumps({"returncode": result.returncode}))
    for scenario, message in (("raises", "rank 0 raised in 'raises'"), ("later", "rank 0 wrote no result")):
        with pytest.raises(pytest.fail.Exception, match=message):
            rank_results(tmp_path, 2, scenario)


def test_an_error_of_a_launch_that_timed_out_says_so(tmp_path):
    """A rank's error in a launch that timed out is reported with the timeout first: it may come from the stop."""
    (tmp_path / "launch.json").write_text(json.dumps({"returncode": None, "timed_out": True, "seconds": 600.0}))
    (tmp_path / "s.rank0.json").write_text(json.dumps({"error": "RuntimeError: DataLoader worker (pid 1) is killed"}))
    with pytest.raises(pytest.fail.Exception, match=r"rank 0 raised in 's' \(the launch timed out after 600.0 s"):
        rank_results(tmp_path, 2, "s")
    (tmp_path / "launch.json").write_text(json.dumps({"returncode": 3, "timed_out": False, "seconds": 9.0}))
    with pytest.raises(pytest.fail.Exception, match=r"rank 0 raised in 's':\n"):
        rank_results(tmp_path, 2, "s")


FORKSERVER = """
import json, multiprocessing, os, sys, threading
sys.path.insert(0, {root!r})
from tests.rank_worker import stop_forkserver, use_forkserver

def child(queue):
    threads = len(os.listdir("/proc/self/task"))
    queue.put({{"ppid": os.getppid(), "main": sys.modules["__main__"].__file__, "threads": threads}})

if __name__ == "__main__":
    rank = os.getpid()
    use_forkserver(["json"])
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=child, args=(queue,))
    process.start()
    seen = queue.get(timeout=60)
    process.join(60)
    stop_forkserver()
    done = threading.Event()
    threading.Thread(target=done.wait).start()  # a forkserver is refused while another thread runs
    try:
        use_forkserver([])
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    done.set()
    print(json.dumps({{"rank": rank, "server": server, "seen": seen, "exitcode": process.exitcode,
                      "server_running": os.path.exists(f"/proc/{{server}}"), "refused": refused}}))
"""


def test_forkserver_is_a_fork_of_the_rank_with_one_thread(tmp_path):
    """``use_forkserver`` forks the rank's forkserver: a worker's parent is that fork (a child of the rank), it has
    one thread and finds the script as ``__main__`` already; the forkserver stops with ``stop_forkserver``; a rank
    that already runs a second thread is refused (the fork could copy a lock that thread holds)."""
    script = tmp_path / "rank.py"
    script.write_text(FORKSERVER.format(root=str(KIT_ROOT)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the launches set it: else numpy's OpenBLAS starts threads
    result = launch.run([sys.executable, str(script)], tmp_path / "log", TIMEOUT, cwd=tmp_path, env=env)
    log = (tmp_path / "log").read_text(errors="replace")
    assert result.returncode == 0, log[-3000:]
    found = json.loads(log.strip().splitlines()[-1])
    assert found["server"] != found["rank"] and found["seen"]["ppid"] == found["server"], found
    assert found["seen"]["threads"] == 1 and found["seen"]["main"] == str(script), found
    assert found["exitcode"] == 0 and not found["server_running"], found
    assert "threads; call it before any starts" in found["refused"], found
