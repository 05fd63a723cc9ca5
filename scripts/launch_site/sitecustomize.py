"""Loaded at start-up by every Python process that ``scripts/launch.py`` or the gate starts (this directory is put
first on ``PYTHONPATH``), and by every process those start in turn (the environment is inherited).

1. A hang explains itself (issue 12): ``SIGUSR1`` makes the process write the Python stack of every thread to its
   standard error, as it was when the process started (a duplicate of file descriptor 2, so that pytest's output
   capture cannot swallow it), with ``faulthandler.register(SIGUSR1, all_threads=True)``. The handler is C code:
   it runs even while the process waits inside a collective or a lock. Forked children (DataLoader workers)
   inherit it. ``launch.run`` sends the signal to every process of a launch that timed out, then kills them.
   The dump is not safe in every state: a forked child that deadlocked inside CPython's own after-fork code
   (CPython 3.11 before 3.11.10, gh-112275: another thread held the runtime's thread-state lock at the fork) still
   lists a half-made thread state, and the dump crashes on it (SIGSEGV) after one "Thread 0x..." line; its parent
   then sees a worker "killed by signal: Segmentation fault" while the launch is being stopped.
2. Where each upstream was imported from (the gate's check): with ``KIT_IMPORT_RECORD=<dir>`` and
   ``KIT_IMPORT_PACKAGES=<name>,<name>``, the process writes ``<dir>/<pid>.json`` at a normal exit:
   ``{"argv": [...], "modules": {module name: file}}`` for every loaded module of those packages.
"""

import atexit
import faulthandler
import json
import os
import signal
import sys


def _stream():
    """A text stream on a duplicate of fd 2 (None when fd 2 is closed)."""
    try:
        return os.fdopen(os.dup(2), "w")
    except OSError:
        return None


_STACKS = _stream()
if _STACKS is not None:
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True, chain=False)


def _record_imports(directory: str, packages: tuple[str, ...]) -> None:
    """Write ``<directory>/<pid>.json`` (see the module docstring); never raises."""
    modules = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())
               if name.partition(".")[0] in packages}
    try:
        path = os.path.join(directory, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"argv": sys.argv, "modules": modules}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


if os.environ.get("KIT_IMPORT_RECORD"):
    atexit.register(_record_imports, os.environ["KIT_IMPORT_RECORD"],
                    tuple(filter(None, os.environ.get("KIT_IMPORT_PACKAGES", "").split(","))))
