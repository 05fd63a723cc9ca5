"""The history search's stored flows in the suite: every history ``make fuzz`` found and stored, replayed on the
release and on the code under test beside the uninterrupted model, and judged as the search judges it.

One test per stored history. It fails when the history is a regression (``scripts/histories/judge.py``: a step the
code under test handles worse than the release, or an invariant it breaks where the release keeps it) and its entry
in ``tests/histories/<upstream>.json`` has no ``status``. The histories run once per pytest session, on job servers
they share (``tests/launched.py``); a history's side is answered from ``build/flows-cache/`` when what it runs is
unchanged (``scripts/histories/cache.py``; ``FLOWS_CACHE=0`` runs it), which each test records as its
``history_release_reused`` and ``history_series_reused`` properties.
"""

import json

import pytest

from scripts.flows.cache import CACHE, reuse_on, series_code
from scripts.flows.run import release_version, series_package
from scripts.histories import cache, judge, stored
from scripts.histories.servers import for_sides
from scripts.sources import KIT_ROOT
from tests.launched import launch_once

UPSTREAMS = ("accelerate", "deepspeed")
STORED = {name: stored.load(name) for name in UPSTREAMS}


def _records(tmp_path_factory, name):
    def run(out_dir):
        servers = {}
        shared = cache.release_inputs(KIT_ROOT / "upstream" / name, release_version(name), name)
        try:
            servers = for_sides(name, out_dir)
            records, reused = cache.replay_stored(servers, out_dir, STORED[name], shared,
                                                  series_code(series_package(name)), CACHE, reuse_on())
        finally:
            for group in servers.values():
                group.close()
        (out_dir / "records.json").write_text(json.dumps({"records": records, "reused": reused}))
        return {"histories": len(records), **{f"{side}_reused": len(ids) for side, ids in reused.items()}}

    out_dir = launch_once(tmp_path_factory, f"histories-{name}", run)
    return json.loads((out_dir / "records.json").read_text())


@pytest.fixture(scope="session")
def accelerate_records(tmp_path_factory):
    return _records(tmp_path_factory, "accelerate")


@pytest.fixture(scope="session")
def deepspeed_records(tmp_path_factory):
    return _records(tmp_path_factory, "deepspeed")


def _params(name):
    return [pytest.param(entry, id=entry["id"], marks=pytest.mark.xdist_group(f"histories-{name}"))
            for entry in STORED[name]]


def _check(records, entry, record_property):
    for side in ("release", "series"):
        record_property(f"history_{side}_reused", records["reused"][side].get(entry["id"], ""))
    found = judge.findings(records["records"][entry["id"]])
    listed = set(entry.get("signatures", [])) if entry.get("status") else set()
    new = [f for f in found if f["signature"] not in listed]
    assert not new, (
        f"{entry['id']} ({entry['words']}) is handled worse by the code under test than by the release"
        + (" beyond its listed findings" if listed else "") + ": "
        + "; ".join(f"step {f['step']}: {f['kind']}: {f['detail']}" for f in new))


@pytest.mark.parametrize("entry", _params("accelerate"))
def test_accelerate_history_is_no_worse_than_the_release(accelerate_records, entry, record_property):
    """The stored history runs on the code under test at least as well as on the release, at every step."""
    _check(accelerate_records, entry, record_property)


@pytest.mark.parametrize("entry", _params("deepspeed"))
def test_deepspeed_history_is_no_worse_than_the_release(deepspeed_records, entry, record_property):
    """As the Accelerate test, for the curriculum sampler through the engine's checkpoints and the sampler's state."""
    _check(deepspeed_records, entry, record_property)
