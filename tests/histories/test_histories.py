"""The history search's stored flows in the suite: every history ``make fuzz`` found and stored, replayed on the
release and on the code under test beside the uninterrupted model, and judged as the search judges it.

One test per stored history. It fails when the history is a regression (``scripts/histories/judge.py``: a step the
code under test handles worse than the release, or an invariant it breaks where the release keeps it) and its entry
in ``tests/histories/<upstream>.json`` has no ``status``. The histories run once per pytest session, on job servers
they share (``tests/launched.py``).
"""

import json

import pytest

from scripts.histories import history, judge, stored
from scripts.histories.servers import for_sides
from tests.launched import launch_once

UPSTREAMS = ("accelerate", "deepspeed")
STORED = {name: stored.load(name) for name in UPSTREAMS}


def _records(tmp_path_factory, name):
    def run(out_dir):
        servers = {}
        try:
            servers = for_sides(name, out_dir)
            records = {entry["id"]: history.replay(servers, out_dir / "checkpoints" / entry["id"], entry["config"],
                                                   entry["steps"]) for entry in STORED[name]}
        finally:
            for group in servers.values():
                group.close()
        (out_dir / "records.json").write_text(json.dumps(records))
        return {"histories": len(records)}

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


def _check(records, entry):
    found = judge.findings(records[entry["id"]])
    listed = set(entry.get("signatures", [])) if entry.get("status") else set()
    new = [f for f in found if f["signature"] not in listed]
    assert not new, (
        f"{entry['id']} ({entry['words']}) is handled worse by the code under test than by the release"
        + (" beyond its listed findings" if listed else "") + ": "
        + "; ".join(f"step {f['step']}: {f['kind']}: {f['detail']}" for f in new))


@pytest.mark.parametrize("entry", _params("accelerate"))
def test_accelerate_history_is_no_worse_than_the_release(accelerate_records, entry):
    """The stored history runs on the code under test at least as well as on the release, at every step."""
    _check(accelerate_records, entry)


@pytest.mark.parametrize("entry", _params("deepspeed"))
def test_deepspeed_history_is_no_worse_than_the_release(deepspeed_records, entry):
    """As the Accelerate test, for the curriculum sampler through the engine's checkpoints and the sampler's state."""
    _check(deepspeed_records, entry)
