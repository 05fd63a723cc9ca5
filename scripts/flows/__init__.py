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
    """The known and accepted differences of upstream ``name``: entries with ``match`` (factor = level or [levels] of
    the entry's kind), ``status`` (``known``: a regression of the current series a later change fixes; ``accepted``: a
    difference the series keeps, stated in its commit message), a ``reason`` and optionally ``kind`` (default
    ``resume``). Raises KitError, naming the entry and what is wrong with it, on anything else."""
    try:
        entries = tomllib.loads(path.read_text()).get(name, [])
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise KitError(f"{path} cannot be read: {e}") from None
    for entry in entries:
        kind = entry.get("kind", "resume")
        problem = ""
        if kind not in KINDS[name]:
            problem = f"kind {kind!r} is not one of {', '.join(KINDS[name])}"
        elif not isinstance(entry.get("match"), dict):
            problem = "match must be a table of factor = level (or [levels])"
        elif entry.get("status") not in ("known", "accepted") or not str(entry.get("reason", "")).strip():
            problem = "it needs status (known or accepted) and a reason"
        else:
            levels = factors.UPSTREAMS[(name, kind)][0]
            for factor, wanted in entry["match"].items():
                listed = wanted if isinstance(wanted, list) else [wanted]
                unknown = [w for w in listed if w not in levels.get(factor, [])]
                if factor not in levels or unknown:
                    problem = f"{factor} = {wanted!r} names no level of a factor of {name}'s {kind} flows"
        if problem:
            raise KitError(f"{path}: an entry of [[{name}]]: {problem}: {entry}")
    return entries


def selection(name: str, full: bool) -> list[dict]:
    """The flows of upstream ``name``: the pairwise covering array, or (``full``) every triple of levels."""
    if full:
        return [flow for kind in KINDS[name] for flow in factors.covering(name, kind, strength=3)]
    return [flow for kind in KINDS[name] for flow in factors.pairwise(name, kind)]


def judged(name: str, flows: list[dict], work: Path, parallel: int = 2, say=print, at: str = "",
           reuse: bool = True) -> list[dict]:
    """Run ``flows`` in ``work`` (the series: the installed checkout, or its commit ``at``; the columns stored in
    ``build/flows-cache/`` reused unless ``reuse`` is false) and judge them: the rows of ``judge.table``."""
    results, reused = run.run(name, flows, work, parallel=parallel, say=say, at=at, reuse=reuse)
    return judge.table(flows, results, NUM_SAMPLES[name], differences(name), reused)
