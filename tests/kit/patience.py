"""Timeouts of the kit's tests that expire on purpose: short on a quiet machine, longer on a busy one."""

import os


def patient(seconds: float) -> float:
    """``seconds`` (what the command needs on a quiet machine, with room) times how busy this machine is: the
    1-minute load average per CPU this process may use, at least 1 (``os.getloadavg``). A test that waits for a
    launch to time out after it started (a hang that must show in the stack dumps) then waits seconds, not the worst
    case of a machine loaded 10 times over, and still gives the launch time to start there."""
    return round(seconds * max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0))), 1)
