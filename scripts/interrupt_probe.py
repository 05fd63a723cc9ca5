"""Interrupt a command at several points of its run and count the processes it leaves behind (issue 14).

``python -m scripts.interrupt_probe --points 10 -- make gate`` runs the command once to time it (or takes
``--duration S``), then ``--points`` more times, each in a process group of its own as a terminal's foreground job
is, sending ``--signal`` (INT: a terminal's Ctrl-C, to the whole group; TERM or HUP: to the leader only, as GNU
make and a closing terminal send them) at ``i / (points + 1)`` of that duration. Every process of a run carries
``KIT_PROBE=<run id>`` in its environment, so one that left the group or the session (a launch in a session of its
own) is still counted: ``left`` is how many such processes live ``--grace`` seconds after the command ended. They
are killed before the next point. ``--reset CMD`` runs between points (e.g. ``make apply`` to put checkouts back).
Prints one line per point and writes ``<out>/<label>.json`` (``--out``, default ``build/probe``). Exit status 0
when nothing was left anywhere.
"""

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from scripts import plural, sources

ENV = "KIT_PROBE"


def processes_of(run_id: str) -> dict[int, str]:
    """{pid: command line} of live (not zombie) processes whose environment holds ``KIT_PROBE=<run_id>``."""
    marker, found = f"{ENV}={run_id}".encode(), {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker not in Path(entry.path, "environ").read_bytes().split(b"\0"):
                continue
            if "\nState:\tZ" in Path(entry.path, "status").read_text():
                continue
            found[int(entry.name)] = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    return found


def run_once(command: list[str], run_id: str, at: float | None, sig: int, grace: float, log: Path) -> dict:
    """Run ``command``; ``at`` seconds in (None: never) send ``sig``; return what happened (see the docstring)."""
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env={**os.environ, ENV: run_id}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=sources.KIT_ROOT)
        sent = False
        try:
            while proc.poll() is None:
                if at is not None and not sent and time.monotonic() - started >= at:
                    (os.killpg if sig == signal.SIGINT else os.kill)(proc.pid, sig)
                    sent = True
                time.sleep(0.05)
        except BaseException:  # the probe itself interrupted: its run, in a session of its own, goes too
            for pid in processes_of(run_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise
    ended = time.monotonic() - started
    time.sleep(grace)
    left = processes_of(run_id)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    return {"at_s": at, "signal_sent": sent, "ended_s": round(ended, 1), "returncode": proc.returncode,
            "left": len(left), "left_commands": list(left.values()), "traceback": "Traceback" in text,
            "last_lines": text.strip().splitlines()[-2:]}


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring); exit status 0 when no point left a process."""
    parser = argparse.ArgumentParser(prog="python -m scripts.interrupt_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument("--signal", default="INT", choices=["INT", "TERM", "HUP"])
    parser.add_argument("--duration", type=float, help="seconds the command takes (default: one timed run)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds after the end before counting")
    parser.add_argument("--reset", default="", help="a command run between points (shell words)")
    parser.add_argument("--label", default="", help="name of the JSON report (default: the command's words)")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "probe",
                        help="where the logs and the JSON report go (default build/probe)")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sig = getattr(signal, f"SIG{args.signal}")
    # A file name of letters, digits, '.', '_' and '-' only, whatever the command's words hold (issue 22).
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", args.label or "-".join(args.command)).strip("_.")[:60]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    duration = args.duration
    if duration is None:
        timed = run_once(args.command, f"{label}-timing", None, sig, 0, out / f"{label}-timing.log")
        duration = timed["ended_s"]
        print(f"probe {label}: one uninterrupted run took {duration} s (exit {timed['returncode']})", flush=True)
    points = []
    for i in range(1, args.points + 1):
        if args.reset:
            subprocess.run(shlex.split(args.reset), cwd=sources.KIT_ROOT, capture_output=True)
        at = round(duration * i / (args.points + 1), 1)
        point = run_once(args.command, f"{label}-{i}", at, sig, args.grace, out / f"{label}-{i}.log")
        points.append(point)
        print(f"probe {label} point {i}: SIG{args.signal} at {at} s (sent: {point['signal_sent']}), ended at "
              f"{point['ended_s']} s, exit {point['returncode']}, left {point['left']}, traceback "
              f"{point['traceback']}; last line: {point['last_lines'][-1:] or ''}", flush=True)
    total = sum(p["left"] for p in points)
    (out / f"{label}.json").write_text(json.dumps({"command": args.command, "signal": args.signal,
                                                   "duration_s": duration, "points": points, "left": total},
                                                  indent=2) + "\n")
    print(f"probe {label}: {plural(total, 'process', 'processes')} left in total over {len(points)} points")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
