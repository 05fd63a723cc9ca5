"""``scripts/servers.py``: a job server takes operations one at a time, its results come back per rank, and a server
that hangs, dies or imports the wrong code is ended and said so; the next operation starts a new one."""

import time
from pathlib import Path

import pytest

from scripts import KitError, launch
from scripts.servers import Server, Store
from scripts.sources import KIT_ROOT

JOB = """
import os, sys, time
sys.path.insert(0, {kit!r})
from tests.rank_worker import serve

def handle(op, args):
    if op == "hang":
        time.sleep(600)
    if op == "exit":
        os._exit(5)
    if op == "crash-rank-1":  # as a step that raised on one rank: its peer waits in a collective that never ends
        if os.environ["RANK"] == "1":
            return {{"crash": "raised"}}
        time.sleep(600)
    if op == "crash":  # raised on every rank: each sends its result, then ends
        return {{"crash": "raised"}}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return {{"rank": rank, "world": world, "echo": args, "pid": os.getpid()}}

if os.environ.get("JOB_START") == "fail":
    sys.exit("no start")
if os.environ.get("JOB_START") == "port-taken-once" and not os.path.exists("port-taken"):
    open("port-taken", "w").close()  # in the server's logs folder, its working directory
    sys.exit("DistNetworkError: ... code: -98, name: EADDRINUSE, message: address already in use")
serve(int(os.environ["RANK"]), {module!r}, handle, ends_rank=lambda result: "crash" in result)
"""


def _server(tmp_path, nproc=2, module="/elsewhere/tiny/__init__.py", code="series", series="/elsewhere/tiny",
            preload=()):
    script = tmp_path / "job.py"
    script.write_text(JOB.format(kit=str(KIT_ROOT), module=module))
    return Server(Store(30), script, "tiny-series", code, nproc, "", tmp_path / "logs", tmp_path / "release",
                  Path(series), preload)


def test_a_server_answers_per_rank_and_a_hang_or_a_death_ends_it(tmp_path):
    server = _server(tmp_path)
    try:
        server.send("echo", {"n": 1})
        first = server.receive(60)
        assert [(r["rank"], r["world"], r["echo"]) for r in first] == [(0, 2, {"n": 1}), (1, 2, {"n": 1})]
        server.send("echo", {"n": 2})
        assert [r["pid"] for r in server.receive(60)] == [r["pid"] for r in first]  # the same processes
        server.send("hang", {})
        hung = server.receive(2)
        assert all("hang" in r and r["server"] for r in hung) and not server.running()
        assert not any(launch.running(r["pid"]) for r in first)
        server.send("echo", {"n": 3})  # a new server
        again = server.receive(60)
        assert [r["echo"] for r in again] == [{"n": 3}] * 2 and server.generation == 2
        server.send("exit", {})
        died = server.receive(60)
        assert all("crash" in r and r["server"] and "exited" in r["crash"] for r in died)
    finally:
        server.stop()
    assert not server.running()


def test_a_server_that_does_not_start_or_imports_the_wrong_code_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("JOB_START", "fail")
    server = _server(tmp_path, nproc=1)
    with pytest.raises(KitError, match="did not start; its log .*no start"):
        server.send("echo", {})
    monkeypatch.delenv("JOB_START")
    release = _server(tmp_path, nproc=1, code="release")  # a release server whose ranks import another tree
    with pytest.raises(KitError, match="imported its upstream from /elsewhere/tiny"):
        release.send("echo", {})
    assert not release.running()
    # a series server whose ranks import another package than the one whose digest keys its stored results
    series = _server(tmp_path, nproc=1, series="/elsewhere/other")
    with pytest.raises(KitError, match="tiny/__init__.py, not from /elsewhere/other"):
        series.send("echo", {})
    assert not series.running()


def test_a_server_whose_rendezvous_port_was_taken_starts_again_on_another(tmp_path, monkeypatch):
    monkeypatch.setenv("JOB_START", "port-taken-once")
    server = _server(tmp_path, nproc=1)
    server.send("echo", {"x": 1})
    assert [r["echo"] for r in server.receive(30)] == [{"x": 1}] and server.generation == 2
    server.stop()


def test_ranks_that_ended_are_started_again_by_their_launcher_and_nothing_is_left(tmp_path):
    server = _server(tmp_path, preload=("colorsys",))  # the ranks fork from a launcher that imported it
    try:
        server.send("echo", {"n": 1})
        first = server.receive(60)
        launcher = server.proc.pid
        server.send("crash-rank-1", {})
        ended = server.receive(60)  # rank 1 sent its result, then ended; rank 0 was ended by the launcher
        assert ended[1] == {"crash": "raised"} and ended[0]["server"] and "exited 3" in ended[0]["crash"]
        assert not server.running() and not any(launch.running(r["pid"]) for r in first)
        server.send("echo", {"n": 2})  # new ranks of the same launcher: no import paid again
        again = server.receive(60)
        assert [(r["rank"], r["world"], r["echo"]) for r in again] == [(0, 2, {"n": 2}), (1, 2, {"n": 2})]
        assert server.proc.pid == launcher and server.generation == 2
        assert not {r["pid"] for r in again} & {r["pid"] for r in first}
        assert set(launch.descendants(launcher)) == {r["pid"] for r in again}
        server.send("crash", {})  # every rank sent a result before it ended: the next step is not sent to them
        assert server.receive(60) == [{"crash": "raised"}] * 2
        server.send("echo", {"n": 3})
        assert [r["echo"] for r in server.receive(60)] == [{"n": 3}] * 2 and server.generation == 3
        server.send("crash-rank-1", {})
        server.receive(60)
        started = time.monotonic()
        server.stop()  # a launcher that waits to start its ranks again is told to end, not waited for
        assert time.monotonic() - started < 10 and not launch.running(launcher)
        assert not any(launch.running(r["pid"]) for r in again)
    finally:
        server.stop()
