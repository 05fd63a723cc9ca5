"""The flow table in the suite: every pairwise flow of each upstream, on its release and on the code under test.

One test per flow. It fails when the flow is a regression (the code under test handles it worse than the release,
``scripts/flows/judge.py``) that ``tests/flows/differences.toml`` does not list. The flows of an upstream run once per
pytest session, in launches shared by its tests (``tests/launched.py``); ``make flows`` writes the same table as a
report. A flow's columns are reused from ``build/flows-cache/`` when what they run is unchanged
(``scripts/flows/cache.py``; ``FLOWS_CACHE=0`` runs them), which each test records as its ``flow_release_reused``
and ``flow_series_reused`` properties; the session's summary counts them.
"""

import json

import pytest

from scripts import flows as table
from scripts.flows import cache, judge, report
from tests.launched import launch_once

UPSTREAMS = sorted(table.KINDS)
SELECTION = {name: table.selection(name, full=False) for name in UPSTREAMS}


def _judged(tmp_path_factory, name):
    def run(out_dir):
        rows = table.judged(name, SELECTION[name], out_dir / "work", say=lambda line: None, reuse=cache.reuse_on())
        (out_dir / "rows.json").write_text(json.dumps(rows))
        return judge.summary(rows)

    out_dir = launch_once(tmp_path_factory, f"flows-{name}", run)
    return {row["id"]: row for row in json.loads((out_dir / "rows.json").read_text())}


@pytest.fixture(scope="session")
def accelerate_rows(tmp_path_factory):
    return _judged(tmp_path_factory, "accelerate")


@pytest.fixture(scope="session")
def deepspeed_rows(tmp_path_factory):
    return _judged(tmp_path_factory, "deepspeed")


def _params(name):
    return [pytest.param(flow["id"], id=flow["id"], marks=pytest.mark.xdist_group(f"flows-{name}"))
            for flow in SELECTION[name]]


def _check(row, record_property):
    record_property("flow_release_reused", row["release_reused"])
    record_property("flow_series_reused", row["series_reused"])
    words = report._factors(row["factors"])
    assert row["verdict"] != "regression" or row["listed"], (
        f"{row['id']} ({words}) is handled worse by the code under test than by the release: release "
        f"{row['release']} {row['release_detail']}; under test {row['series']} {row['series_detail']}")


@pytest.mark.parametrize("flow", _params("accelerate"))
def test_accelerate_flow_is_no_worse_than_the_release(accelerate_rows, flow, record_property):
    """The flow resumes on the code under test at least as well as on the release (exact or a clear error where
    the release is exact or errs; not uneven, hung or crashed where the release is merely wrong)."""
    _check(accelerate_rows[flow], record_property)


@pytest.mark.parametrize("flow", _params("deepspeed"))
def test_deepspeed_flow_is_no_worse_than_the_release(deepspeed_rows, flow, record_property):
    """As the Accelerate test, for the curriculum sampler through the sampler's state and the engine's checkpoints."""
    _check(deepspeed_rows[flow], record_property)
