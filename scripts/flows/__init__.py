"""The flow table: the ways a training job saves and restarts, run on the release and on the series, and judged.

``factors.py`` names the flows, the job scripts in ``tests/flows/`` run them, ``run.py`` launches them, ``judge.py``
judges them and ``report.py`` writes ``build/flows/``. ``make flows`` is ``python -m scripts.flows``; the suite runs
the pairwise set (``tests/flows/test_flows.py``).
"""

import tomllib
from pathlib import Path

from scripts import KitError
from scripts.flows import factors, judge, run

DIFFERENCES = Path(__file__).resolve().parents[2] / "tests" / "flows" / "differences.toml"
NUM_SAMPLES = {"accelerate": 32, "deepspeed": 32}  # the sample ids 0..N-1 of each job script's dataset
KINDS = {"accelerate": ("resume", "order"), "deepspeed": ("resume", "release-order")}


def differences(name: str, path: Path = DIFFERENCES) -> list[dict]:
    """The known and accepted differences of upstream ``name``: entries with ``match``, ``status`` (``known``: a
    regression of the current series a later change fixes; ``accepted``: a difference the series keeps, stated in its
    commit message), ``reason`` and optionally ``kind``. Raises KitError on an entry without those keys."""
    entries = tomllib.loads(path.read_text()).get(name, [])
    for entry in entries:
        if not {"match", "status", "reason"} <= entry.keys() or entry["status"] not in ("known", "accepted"):
            raise KitError(f"{path}: an entry of [[{name}]] needs match, status (known or accepted) and reason: "
                           f"{entry}")
    return entries


def selection(name: str, full: bool) -> list[dict]:
    """The flows of upstream ``name``: the pairwise covering array, or (``full``) every triple of levels."""
    if full:
        return [flow for kind in KINDS[name] for flow in factors.covering(name, kind, strength=3)]
    return [flow for kind in KINDS[name] for flow in factors.pairwise(name, kind)]


def judged(name: str, flows: list[dict], work: Path, parallel: int = 2, say=print, at: str = "") -> list[dict]:
    """Run ``flows`` in ``work`` (the series: the installed checkout, or its commit ``at``) and judge them: the rows
    of ``judge.table``."""
    results = run.run(name, flows, work, parallel=parallel, say=say, at=at)
    return judge.table(flows, results, NUM_SAMPLES[name], differences(name))
