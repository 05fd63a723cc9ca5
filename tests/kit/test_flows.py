"""The flow table's own machinery: the covering arrays, the judge (pure, on records made here), and the oracle failing.

The last test runs real launches: a "series" that is the release with its ``load_state_dict`` broken must come out as
regressions, and the release put in the series' place must come out the same as the release on every flow.
"""

import json
import shutil

import pytest

from scripts import KitError
from scripts import flows as table
from scripts.flows import cache, factors, judge, run

N = 8  # samples of the synthetic records below


def save_record(truth, step, before=None, after=None, at_end=False):
    epoch = truth[0]
    before = epoch[:step] if before is None else before
    return {"truth": truth, "epoch": 0, "step": step, "at_end": at_end, "before": before,
            "after": epoch[step:] if after is None else after}


TRUTH = [  # two processes, two epochs of two batches of 2 each; every epoch a partition of 0..7
    [[[0, 1], [2, 3]], [[7, 6], [5, 4]]],
    [[[4, 5], [6, 7]], [[3, 2], [1, 0]]],
]


def saved(step=1):
    return [save_record(truth, step) for truth in TRUTH]


def loaded(rest, following):
    return [{"loops": [rest[r], following[r]]} for r in range(len(rest))]


def test_a_restart_that_reads_what_the_uninterrupted_run_reads_is_exact():
    parts = judge.resume_parts(saved(), loaded([[[2, 3]], [[6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert judge.worst(parts) == ("exact", "")


def test_a_restart_that_starts_the_epoch_over_is_wrong_with_its_numbers():
    parts = judge.resume_parts(saved(), loaded([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], [TRUTH[0][1], TRUTH[1][1]]),
                               N)
    outcome, detail = judge.worst(parts)
    assert outcome == "wrong" and parts["the next epoch"][0] == "exact"
    assert "2 batches read for 1, 2 differ; 2 samples read beyond the uninterrupted run, 0 of its samples never" in (
        detail)


def test_processes_with_different_numbers_of_batches_left_are_uneven():
    parts = judge.resume_parts(saved(), loaded([[[2, 3]], [[4, 5], [6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert judge.worst(parts) == ("uneven", "the rest of the epoch: the processes read [1, 2] batches")


def test_an_uninterrupted_run_that_is_no_partition_and_a_checkpoint_that_changes_the_run_are_wrong():
    duplicated = [save_record([[[0, 1], [2, 3]], TRUTH[0][1]], 1), save_record([[[0, 1], [6, 7]], TRUTH[1][1]], 1,
                                                                               after=[[4, 5]])]
    parts = judge.resume_parts(duplicated, loaded([[[2, 3]], [[6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert parts["the uninterrupted run"] == (
        "wrong", "the uninterrupted run's epoch 0 reads 2 samples twice and 2 never")
    assert parts["the saving run"][0] == "wrong" and "process 1" in parts["the saving run"][1]


def test_a_refusal_before_the_first_batch_is_an_error_and_a_missing_record_a_crash():
    refused = [{"error": "ValueError: saved by 2 processes, loaded by 4", "raised_here": True}, {"error": "x"}]
    assert judge.worst(judge.resume_parts(saved(), refused, N)) == (
        "error", "the restart raised: ValueError: saved by 2 processes, loaded by 4")
    assert judge.worst(judge.resume_parts(saved(), [{"hang": "no result after 90 s"}, None], N))[0] == "hang"
    assert judge.worst(judge.resume_parts(saved(), [{"loops": [[], []]}, None], N)) == (
        "crash", "the restarted run: process 1 wrote no record")


def test_a_bug_raised_at_load_is_a_crash_and_an_error_hides_no_crash_of_another_process():
    bug = [{"error": "AttributeError: 'NoneType' object has no attribute 'x'", "raised_here": True}] * 2
    assert judge.worst(judge.resume_parts(saved(), bug, N))[0] == "crash"
    refused = {"error": "ValueError: x", "raised_here": True}
    assert judge.worst(judge.resume_parts(saved(), [refused, {"crash": "Traceback\nOSError: gone"}], N)) == (
        "crash", "the restarted run: process 1: OSError: gone")
    assert judge.worst(judge.resume_parts(saved(), [{"crash": "RuntimeError: a"}, {"hang": "b"}], N))[0] == "crash"


def test_a_crash_names_its_cause_before_the_peers_it_ended():
    lost = {"crash": "Traceback\nRuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234"}
    cause = {"crash": "Traceback\nValueError: Global rank 0 is not part of group"}
    assert judge.failure([lost, cause], "the run") == ("crash", "the run: process 1: ValueError: Global rank 0 is "
                                                                "not part of group")
    assert judge.failure([lost, lost], "the run")[1].startswith("the run: process 0: RuntimeError")


def test_a_checkpoint_that_ends_one_process_early_leaves_the_saving_run_uneven():
    cut = [save_record(TRUTH[0], 1), save_record(TRUTH[1], 1, after=[])]
    parts = judge.resume_parts(cut, loaded([[[2, 3]], [[6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert parts["the saving run"][0] == "uneven"
    short = [save_record(TRUTH[0], 1, after=[]), save_record(TRUTH[1], 1, after=[])]
    parts = judge.resume_parts(short, loaded([[[2, 3]], [[6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert parts["the saving run"][0] == "wrong"
    dies = [dict(save_record(t, 1, after=[]), saving_run_ends=1) for t in TRUTH]  # the record says it dies there
    parts = judge.resume_parts(dies, loaded([[[2, 3]], [[6, 7]]], [TRUTH[0][1], TRUTH[1][1]]), N)
    assert parts["the saving run"] == ("exact", "")


def test_a_record_with_nothing_after_its_checkpoint_is_refused():
    at_end = [save_record([t[0]], 2, at_end=True) for t in TRUTH]
    with pytest.raises(ValueError, match="nothing after its checkpoint"):
        judge.resume_parts(at_end, [{"loops": [[[9]]]}] * 2, N)


def test_another_number_of_processes_is_judged_on_the_samples_of_all_processes():
    rest = [[[2]], [[3]], [[6]], [[7]]]
    following = [[[7, 6]], [[5, 4]], [[3, 2]], [[1, 0]]]
    assert judge.worst(judge.resume_parts(saved(), loaded(rest, following), N)) == ("exact", "")
    rest[3] = [[0]]
    outcome, detail = judge.worst(judge.resume_parts(saved(), loaded(rest, following), N))
    assert outcome == "wrong" and "1 beyond the uninterrupted run, 1 of its samples never" in detail


def test_a_regression_is_a_part_the_series_handles_worse():
    exact = {"the rest of the epoch": ("exact", ""), "the next epoch": ("exact", "")}
    wrong_next = {"the rest of the epoch": ("exact", ""), "the next epoch": ("wrong", "d")}
    wrong_rest = {"the rest of the epoch": ("wrong", "d"), "the next epoch": ("wrong", "d")}
    assert judge.verdict(exact, exact) == "same"
    assert judge.verdict(exact, {"the restart": ("error", "refused")}) == "regression"  # the release resumed it
    assert judge.verdict({"the restart": ("error", "a")}, {"the restart": ("error", "b")}) == "same"
    assert judge.verdict(wrong_rest, {"the restart": ("error", "refused")}) == "same"
    assert judge.verdict(wrong_next, wrong_rest) == "regression"  # both wrong, the series in one more part
    assert judge.verdict(wrong_rest, {"the rest of the epoch": ("uneven", "d")}) == "regression"
    assert judge.verdict(wrong_rest, exact) == "fixed"


def test_a_release_order_flow_compares_the_series_run_with_the_release_run_where_the_release_has_one():
    run, other = {"run": [[0, 1], [2, 3]]}, {"run": [[2, 3], [0, 1]]}
    crashed = {"crash": "Traceback\nValueError: Global rank 0 is not part of group"}
    assert judge.outcome("release-order", {"order": [run]}, N, {"order": [run]}) == {"the order": ("exact", "")}
    assert judge.outcome("release-order", {"order": [other]}, N, {"order": [run]})["the order"][0] == "wrong"
    # a job the release cannot run: no order of the release to keep, and the series' own failure still shows
    assert judge.outcome("release-order", {"order": [run]}, N, {"order": [crashed]}) == {"the order": ("exact", "")}
    assert judge.outcome("release-order", {"order": [crashed]}, N, {"order": [run]})["the order"][0] == "crash"


def test_listed_differences_match_by_factors_and_unused_ones_are_reported():
    entries = [{"match": {"saver": "main-only", "workers": ["0", "2"]}, "status": "known", "reason": "r"},
               {"match": {}, "kind": "order", "status": "known", "reason": "o"}]
    assert judge.listed({"saver": "main-only", "workers": "2"}, entries) is entries[0]
    assert judge.listed({"saver": "main-only", "workers": "2-persistent"}, entries[:1]) is None
    rows = [{"kind": "resume", "factors": {"saver": "main-only", "workers": "0"}, "verdict": "regression"}]
    assert judge.unused(rows, entries) == [entries[1]]


def test_the_pairwise_set_covers_every_possible_pair_holds_the_presets_and_is_fixed():
    for name, kinds in table.KINDS.items():
        for kind in kinds:
            flows = factors.pairwise(name, kind)
            assert factors.uncovered_pairs(name, kind, flows) == []
            assert flows == factors.pairwise(name, kind)
            assert len({flow["id"] for flow in flows}) == len(flows)
            assert all(factors.possible(name, kind, flow["factors"]) for flow in flows)
            for preset in factors.UPSTREAMS[(name, kind)][2]:
                assert any(preset.items() <= flow["factors"].items() for flow in flows), preset


def test_the_differences_file_names_a_status_and_a_reason_for_every_entry():
    for name in table.KINDS:
        for entry in table.differences(name):
            assert entry["reason"] and entry["status"] in ("known", "accepted")


@pytest.mark.parametrize("text, says", [
    ('[[accelerate]]\nstatus = "known"\nmatch = "saver=main-only"\nreason = "r"\n', "match must be a table"),
    ('[[accelerate]]\nstatus = "known"\nkind = "orders"\nmatch = {}\nreason = "r"\n', "kind 'orders'"),
    ('[[accelerate]]\nstatus = "known"\nmatch = {}\nreason = ""\n', "a reason"),
    ('[[accelerate]]\nstatus = "known"\nmatch = { saver = "main_only" }\nreason = "r"\n', "names no level"),
    ("[[accelerate]\n", "cannot be read"),
])
def test_a_malformed_differences_entry_is_one_line_naming_it(tmp_path, text, says):
    path = tmp_path / "differences.toml"
    path.write_text(text)
    with pytest.raises(KitError, match=says):
        table.differences("accelerate", path)


BROKEN = '''

def _broken_load_state_dict(self, state_dict):
    """Deliberately broken by the kit's test: the loaded state is dropped."""


DataLoaderShard.load_state_dict = _broken_load_state_dict
'''


def test_the_oracle_finds_a_broken_series_and_nothing_in_the_release_itself(tmp_path, monkeypatch):
    """Flows on one process: a "series" that drops every loaded dataloader state (the release's tree with
    ``DataLoaderShard.load_state_dict`` replaced) makes the release's exact resumes regressions; the release in the
    series' place makes none. The second run reuses the release columns the first stored (``cache.py``), and judges
    them as the first did; the same series again reuses its columns too, a one-line edit to its package runs them
    again (and reuses the release's); with an input of every key changed, each column runs again."""
    monkeypatch.setattr(cache, "CACHE", tmp_path / "flows-cache")
    one = {"saver": "torch-save", "loader": "shard", "processes": "1-1", "when": "mid-epoch", "epoch": "0",
           "workers": "0", "seeding": "one-seed", "training": "no-rng", "probe": "none", "versions": "series"}
    chosen = [("resume", {**one, "data": "sequential"}), ("resume", {**one, "data": "shuffled", "workers": "2"}),
              ("order", {"data": "shuffled", "loader": "shard", "processes": "1", "workers": "0",
                         "seeding": "one-seed"})]
    flows = [{"id": factors.flow_id("accelerate", kind, f), "upstream": "accelerate", "kind": kind, "factors": f}
             for kind, f in chosen]
    release = run.release_tree("accelerate", tmp_path / "trees")
    broken = tmp_path / "broken"
    shutil.copytree(release, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "accelerate" / "data_loader.py").write_text((release / "accelerate" / "data_loader.py").read_text()
                                                          + BROKEN)
    rows = {}
    for label, series in (("broken", broken), ("release", release)):
        monkeypatch.setenv("PYTHONPATH", str(series))
        rows[label] = table.judged("accelerate", flows, tmp_path / label, say=lambda line: None)
    resumed = [row for row in rows["broken"] if row["kind"] == "resume" and row["release"] == "exact"]
    assert resumed and all(row["verdict"] == "regression" for row in resumed), json.dumps(rows["broken"], indent=1)
    assert [row["verdict"] for row in rows["release"]] == ["same"] * 3, json.dumps(rows["release"], indent=1)
    assert [(row["release"], row["release_detail"]) for row in rows["release"]] == [
        (row["series"], row["series_detail"]) for row in rows["release"]]
    assert not any(row["release_reused"] for row in rows["broken"])
    assert all(row["release_reused"] for row in rows["release"]), json.dumps(rows["release"], indent=1)
    assert [(row["release"], row["release_detail"]) for row in rows["release"]] == [
        (row["release"], row["release_detail"]) for row in rows["broken"]]
    assert not any(row["series_reused"] for label in rows for row in rows[label])

    def judged_again(label):
        again = table.judged("accelerate", flows, tmp_path / label, say=lambda line: None)
        assert [(r["release"], r["series"], r["verdict"]) for r in again] == [
            (r["release"], r["series"], r["verdict"]) for r in rows["release"]]
        return [(bool(r["release_reused"]), bool(r["series_reused"])) for r in again]

    assert judged_again("same") == [(True, True)] * 3
    state = release / "accelerate" / "state.py"  # the series' package (PYTHONPATH), not the release column's tree
    state.write_text(state.read_text() + "# a one-line edit\n")
    assert judged_again("edited") == [(True, False)] * 3
    monkeypatch.setattr(run, "TASK_TIMEOUT", run.TASK_TIMEOUT + 1)  # an input of every key: the columns run again
    assert judged_again("again") == [(False, False)] * 3


def test_the_bench_judges_the_flow_tables_cost_on_make_tests_cpu():
    from scripts.bench import targets

    runs = {"without accelerate": {"seconds": 100.0, "cpu_s": 200.0}, "cold": {"seconds": 190.0, "cpu_s": 380.0},
            "edit accelerate": {"seconds": 150.0, "cpu_s": 300.0}, "edit deepspeed": {"seconds": 120, "cpu_s": 240},
            "without deepspeed": {"seconds": 100.0, "cpu_s": 200.0}}
    rows = targets.flows_targets({"test": [runs]})
    assert [(r["goal"].split(" to ")[1].split("'")[0], r["verdict"], r["measured"]) for r in rows] == [
        ("accelerate", "not met", "1.50 [1.50-1.50]x"), ("deepspeed", "met", "1.20 [1.20-1.20]x")]
    runs["edit accelerate"]["cpu_s"] = 240.0
    assert [r["verdict"] for r in targets.flows_targets({"test": [runs]})] == ["met", "met"]


def test_a_release_columns_key_changes_with_each_of_its_inputs_and_with_nothing_else(tmp_path, monkeypatch):
    """``cache.py``: the key of a flow's release column changes when the release's tree, a module the job imports
    (directly or through another), the runner, the task timeout, the flow, the lock or an installed distribution
    changes; a commit on the release (the series), a kit module the job does not import and the judge change nothing:
    the stored records are judged anew."""
    from importlib import metadata

    from scripts import cache as reuse
    from scripts.git import git
    from tests.kit.test_gate import commit
    from tests.kit.test_gate_cache import FakeDistribution

    kit = tmp_path / "kit"
    files = {"scripts/__init__.py": "", "scripts/launch.py": "", "scripts/flows/run.py": "", "scripts/servers.py": "",
             "scripts/ranks.py": "", "scripts/launch_site/sitecustomize.py": "",
             "scripts/flows/judge.py": "", "tests/__init__.py": "", "tests/flows/__init__.py": "",
             "tests/flows/helper.py": "from scripts import launch\n",
             "tests/flows/job.py": "import json\n\ndef main():\n    from tests.flows.helper import x\n"}
    for name, text in files.items():
        (kit / name).parent.mkdir(parents=True, exist_ok=True)
        (kit / name).write_text(text)
    monkeypatch.setattr(cache, "KIT_ROOT", kit)
    runners = tuple(kit / "scripts" / name for name in ("flows/run.py", "servers.py", "ranks.py",
                                                        "launch_site/sitecustomize.py"))
    monkeypatch.setattr(cache, "RUNNERS", runners)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("numpy==2.3.5\n")
    monkeypatch.setattr(reuse, "CONSTRAINTS", constraints)
    repo = tmp_path / "upstream"
    (repo / "tiny").mkdir(parents=True)
    (repo / "tiny" / "__init__.py").write_text("VALUE = 1\n")
    git(repo.parent, "init", "--quiet", str(repo))
    commit(repo, "Release 1.0")
    git(repo, "tag", "base/1.0")
    job = kit / "tests" / "flows" / "job.py"
    assert [p.relative_to(kit).as_posix() for p in reuse.kit_files(job, kit)] == [
        "scripts/__init__.py", "scripts/launch.py", "tests/__init__.py", "tests/flows/__init__.py",
        "tests/flows/helper.py", "tests/flows/job.py"]
    flow = {"id": "f1", "kind": "resume", "factors": {"workers": "0"}}

    def current(timeout=90.0, of=flow):
        return cache.key(cache.release_inputs(repo, "1.0", job, timeout), of)

    before = current()

    def edit(path, text="# edited\n"):
        path.write_text(path.read_text() + text)

    def retag():
        (repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")
        commit(repo, "Change the release")
        git(repo, "tag", "--force", "base/1.0")

    changes = {"the release's tree": retag, "a module the job imports through another":
               lambda: edit(kit / "tests" / "flows" / "helper.py"), "the job": lambda: edit(job),
               "the runner": lambda: edit(cache.RUNNERS[0]), "the job servers": lambda: edit(cache.RUNNERS[1]),
               "the ranks' launcher": lambda: edit(cache.RUNNERS[2]), "sitecustomize": lambda: edit(cache.RUNNERS[3]),
               "the lock": lambda: edit(constraints, "torch==2.13.0\n"),
               "a distribution": lambda: monkeypatch.setattr(
                   metadata, "distributions", lambda found=metadata.distributions: [*found(), FakeDistribution()])}
    for what, change in changes.items():
        change()
        after = current()
        assert after != before, f"changing {what} left the key as it was"
        before = after
    assert current(timeout=91.0) != before and current(of={**flow, "factors": {"workers": "2"}}) != before
    (repo / "tiny" / "__init__.py").write_text("VALUE = 3\n")
    commit(repo, "The series' fix")
    edit(kit / "scripts" / "flows" / "judge.py")
    assert current() == before


def test_only_a_release_column_every_rank_recorded_without_a_hang_or_a_machines_crash_is_stored():
    ok = {"loops": []}
    code = {"crash": "Traceback (most recent call last):\n  ...\nValueError: Global rank 0 is not part of group"}
    peer = {"crash": "Traceback (most recent call last):\n  ...\nRuntimeError: [gloo] Connection closed by peer"}
    timeout = {"crash": "Traceback (most recent call last):\n  ...\nRuntimeError: Socket Timeout"}
    killed = {"crash": "no record; the launch exited 1", "runner": True}
    assert cache.storable({"save": [ok, ok], "load": [ok, ok]})
    assert cache.storable({"order": [code, peer]})  # the code's error on one rank ended the other: the same each time
    assert cache.storable({"save": [ok, ok], "load": [code, code]})
    assert not cache.storable({"order": [peer, peer]})  # a lost peer alone may be the machine's: again
    assert not cache.storable({"order": [timeout, code]})
    assert cache.storable({"save": [code, killed]})  # the launcher ended the other rank when this one exited
    assert not cache.storable({"save": [peer, killed]})  # a rank killed (out of memory) wrote no record
    assert not cache.storable({"save": [ok, None], "load": [ok, ok]})
    assert not cache.storable({"save": [ok, {"hang": "no result after 90 s"}]})
    assert not cache.storable({"save": [ok, killed]})
    assert not cache.storable({})
