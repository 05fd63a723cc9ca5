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
from scripts.histories.servers import Servers
from tests.launched import launch_once

STORED = stored.load("accelerate")


@pytest.fixture(scope="session")
def accelerate_records(tmp_path_factory):
    def run(out_dir):
        servers = {side: Servers("accelerate", out_dir / side) for side in history.SIDES}
        try:
            records = {entry["id"]: history.replay(servers, out_dir / "checkpoints" / entry["id"], entry["config"],
                                                   entry["steps"]) for entry in STORED}
        finally:
            for group in servers.values():
                group.close()
        (out_dir / "records.json").write_text(json.dumps(records))
        return {"histories": len(records)}

    out_dir = launch_once(tmp_path_factory, "histories-accelerate", run)
    return json.loads((out_dir / "records.json").read_text())


@pytest.mark.parametrize("entry", [pytest.param(entry, id=entry["id"],
                                                marks=pytest.mark.xdist_group("histories-accelerate"))
                                   for entry in STORED])
def test_stored_history_is_no_worse_than_the_release(accelerate_records, entry):
    """The stored history runs on the code under test at least as well as on the release, at every step."""
    found = judge.findings(accelerate_records[entry["id"]])
    listed = set(entry.get("signatures", [])) if entry.get("status") else set()
    new = [f for f in found if f["signature"] not in listed]
    assert not new, (
        f"{entry['id']} ({entry['words']}) is handled worse by the code under test than by the release"
        + (" beyond its listed findings" if listed else "") + ": "
        + "; ".join(f"step {f['step']}: {f['kind']}: {f['detail']}" for f in new))
