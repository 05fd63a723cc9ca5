"""``python -m scripts.gate``: the gate (``make gate``); see scripts/gate/__init__.py."""

import sys

from scripts import runlock
from scripts.gate import main

sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
