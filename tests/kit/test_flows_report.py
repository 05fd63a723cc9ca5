"""The flow table's and the history search's reports read on their own (issue 51): a header with the upstream, the
release and the issues; one summary line per kind of flow, whose counts add up and which the gate's report and
``make pr`` cite as they are; a glossary of every level used, from ``FACTOR_WORDS``; whole cells, the long details
in full in the details file; each listed reason once; the job's own faults apart. And ``AT`` said one way.
"""

import json
import re

from scripts import pr
from scripts.flows import factors, judge, report
from scripts.gate import report as gate_report
from scripts.histories import report as histories_report
from scripts.histories import search
from scripts.sources import KIT_ROOT

ABOUT = {"release": "0.19.8", "url": "https://github.com/deepspeedai/DeepSpeed",
         "stack": [{"subject": "Fix the sampler", "key": 8787, "proposal_on": 8406},
                   {"subject": "Keep the cluster files", "key": "cluster-files", "proposal_on": None}]}
SAMPLER = {"ranks": "1", "parallel": "data", "workers": "0", "clusters": "single", "checkpoint": "early",
           "path": "sampler", "keep": "all"}
LONG = ("the rest of the epoch on process 0: 20 batches read for 20, 20 differ; 9 samples read beyond the "
        "uninterrupted run, 9 of its samples never; the rest of the epoch on process 1: 20 batches read for 20, 20 "
        "differ; 9 samples read beyond the uninterrupted run, 9 of its samples never")
REASON = "commit 5: another random order of the same samples after a second reshuffle, " * 5  # 400 characters


def row(flow_id, versions="series", kind="resume", release=("exact", ""), series=("exact", ""), verdict="same",
        listed="", truth=("exact", "exact")):
    """A judged row as ``judge.table`` makes it; ``truth``: the uninterrupted run's outcome on each column."""
    parts = {column: {"the uninterrupted run": t, "the saving run": "exact", "the rest of the epoch": o[0]}
             for column, t, o in (("release", truth[0], release), ("series", truth[1], series))}
    return {"id": flow_id, "kind": kind, "factors": SAMPLER | ({"versions": versions} if kind == "resume" else {}),
            "verdict": verdict, "release_reused": "", "release": release[0], "release_detail": release[1],
            "series": series[0], "series_detail": series[1], "release_parts": parts["release"],
            "series_parts": parts["series"], "listed": listed}


ROWS = [
    row("f1", release=("wrong", LONG), verdict="fixed"),
    row("f2", "rollback", release=("error", "the restart raised: UnpicklingError: Weights only load failed."),
        series=("wrong", LONG), verdict="regression", listed=REASON),
    row("f3", "upgrade", series=("warned", "the rest of the epoch on process 0: 2 batches differ (the restart "
                                 "warned: it said so)"), release=("wrong", "the rest of the epoch: 2 differ")),
    row("f4", kind="release-order", series=("wrong", "process 0 against the release: 8 differ"),
        verdict="regression", listed=REASON),
    row("f5", kind="release-order", series=("wrong", "process 0 against the release: 4 differ"),
        verdict="regression", listed=REASON),
    row("f6", release=("wrong", "the uninterrupted run's epoch 0 reads 7 samples twice and 7 never"),
        series=("wrong", "the uninterrupted run's epoch 0 reads 7 samples twice and 7 never"),
        truth=("wrong", "wrong")),
    row("f7", release=("wrong", "the uninterrupted run's epoch 0 reads 9 samples twice and 9 never"),
        verdict="fixed", truth=("wrong", "exact")),
]


def doc(rows=ROWS):
    return report.document("deepspeed", rows, "every pair of levels (strength 2)", "c0ffee" * 6, [], ABOUT,
                           [{"match": {}, "status": "accepted", "reason": REASON}])


def test_the_kinds_of_flow_add_up_to_all_flows():
    kinds = judge.groups(ROWS)
    assert list(kinds) == [*judge.GROUPS, "all"]
    assert {name: c["flows"] for name, c in kinds.items()} == {
        "series": 2, "rollback": 1, "upgrade": 1, "order": 2, "own-fault": 1, "all": 7}
    for key in ("flows", "regressions", "unlisted_regressions", "fixed"):
        assert sum(kinds[name][key] for name in judge.GROUPS) == kinds["all"][key]
    for column in ("release", "series"):
        for outcome in judge.ORDER:
            assert sum(kinds[n][column].get(outcome, 0) for n in judge.GROUPS) == kinds["all"][column].get(outcome, 0)


def test_an_uninterrupted_run_wrong_on_both_columns_is_the_jobs_own_fault_and_on_the_release_alone_is_not():
    assert [judge.own_fault(r) for r in ROWS] == [False] * 5 + [True, False]
    assert judge.group(ROWS[5]) == "own-fault" and judge.group(ROWS[6]) == "series"


def test_the_report_leads_with_the_upstream_the_release_the_issues_and_a_line_per_kind():
    text = report.markdown(doc(), "deepspeed-details.md")
    lines = text.splitlines()
    assert lines[0] == "# Flow table: DeepSpeed 0.19.8 and the kit's stack"
    assert "[#8787](https://github.com/deepspeedai/DeepSpeed/issues/8787)" in lines[2]
    assert "#8406" in lines[2] and "cluster-files" in lines[2] and "2 commits" in lines[2]
    said = [line[2:] for line in lines if line.startswith("- ")][:6]
    assert said == doc()["lines"]
    assert said[0] == ("all flows: 7 flows; 0.19.8 alone: exact 2, refused 1, warned 0, wrong 4, uneven 0, hang 0, "
                       "crash 0; the stack: exact 2, refused 0, warned 1, wrong 4, uneven 0, hang 0, crash 0; "
                       "regressions 3 (all listed as accepted or known), fixed 2")
    assert said[1].startswith("the stack saves and loads: 2 flows;")
    assert said[2].startswith("rollback (0.19.8 loads what the stack saved): 1 flows;")
    assert "; the stack saving, 0.19.8 loading: exact" in said[2]
    assert "regressions 2 (all listed as accepted or known)" in said[4]
    assert said[5].startswith("the job's own fault")
    flows, own = text.split("## The job's own fault")[:2]
    assert "| [f6](" in own and "| [f6](" not in flows and "| [f7](" in flows


def test_no_cell_is_cut_mid_phrase_and_the_details_hold_each_detail_whole():
    text = report.markdown(doc(), "deepspeed-details.md")
    cells = [c.strip() for line in text.splitlines() if line.startswith("| [f") for c in line.split(" | ")[3:5]]
    for c in cells:
        said = re.sub(r" \.\.\. \(\[in full\]\(deepspeed-details\.md#f\d\)\)$", "", c)
        detail = said.partition(": ")[2]
        if said != c:  # shortened: whole clauses of the detail, and a link to it in full
            assert any(r["release_detail"].startswith(detail) or r["series_detail"].startswith(detail)
                       for r in ROWS), c
            assert any(detail + sep in LONG for sep in ("; ",)) or detail.endswith("."), c
        else:
            assert detail in {r["release_detail"] for r in ROWS} | {r["series_detail"] for r in ROWS}, c
    details = report.details(doc(), "deepspeed.md")
    assert details.count(LONG) == 2 and "## f1" in details and "## f6" in details
    assert "refused: the restart raised: UnpicklingError: Weights only load failed." in text
    assert report.head("a refusal. " + "of many words " * 20) == "a refusal."
    assert report.head("one clause; " + "x" * 200) == "one clause" and report.head("x" * 200) == ""


def test_each_listed_reason_is_printed_once_and_cited_by_its_key():
    text = report.markdown(doc(), "deepspeed-details.md")
    assert text.count(REASON.strip()) == 1
    assert "- **R1** (accepted, 3 flows): " in text
    assert len([line for line in text.splitlines() if line.startswith("| [f") and line.endswith("| R1 |")]) == 3


def test_every_level_of_every_factor_has_words_and_the_glossary_gives_those_used():
    for (upstream, kind), (levels, _, _) in factors.UPSTREAMS.items():
        for factor, names in levels.items():
            missing = [n for n in names if n not in factors.FACTOR_WORDS[upstream].get(factor, {})]
            assert not missing, f"{upstream} {kind}: {factor} {missing} have no words in FACTOR_WORDS"
    for upstream, strategy in search.CONFIGS.items():  # the history search's configurations
        config = strategy.wrapped_strategy
        config = getattr(config, "mapped_strategy", config)  # DeepSpeed's, mapped after it is drawn
        config = getattr(config, "wrapped_strategy", config)
        for factor, inner in config.mapping.items():
            values = getattr(inner, "elements", None) or inner.wrapped_strategy.element_strategy.elements
            missing = [v for v in values if v not in factors.FACTOR_WORDS[upstream].get(factor, {})]
            assert not missing, f"the history search's {upstream} {factor} {missing} have no words"
    text = report.markdown(doc(), "deepspeed-details.md")
    glossary = text[text.index("## Glossary"):]
    for factor, level in {(f, v) for r in ROWS for f, v in r["factors"].items()}:
        assert f"  - `{level}`: {factors.FACTOR_WORDS['deepspeed'][factor][level]}" in glossary
    assert "no words in FACTOR_WORDS" not in glossary


def test_the_gate_report_and_the_pr_bodies_cite_the_lines_of_the_report(tmp_path):
    record = doc() | {"series_id": "abc", "uncommitted": []}
    (tmp_path / "deepspeed.json").write_text(json.dumps(record))
    (tmp_path / "accelerate.json").write_text(json.dumps(record | {"upstream": "accelerate", "series_id": "old"}))
    gate = {"upstreams": {"accelerate": {"series_id": "abc"}, "deepspeed": {"series_id": "abc"}},
            "flows": gate_report.flows_records(tmp_path)}
    md = gate_report.flows_lines(gate)
    assert md[0] == "- accelerate: no flow table of this series is on record (`make flows`)."
    assert md[1].startswith("- deepspeed: the flow table (every pair of levels (strength 2); ")
    assert md[2:-1] == [f"  - {line}" for line in record["lines"]]
    body = pr.flows_sentence("deepspeed", tmp_path / "deepspeed.json", "c0ffee" * 6)
    assert body.splitlines()[2:] == [f"- {line}" for line in record["lines"]]
    assert pr.flows_sentence("deepspeed", tmp_path / "deepspeed.json", "beef").startswith(
        "The last `make flows` ran another version")
    assert pr.flows_sentence("deepspeed", tmp_path / "none.json", "c0ffee") == (
        "The flow table was not run on this series (`make flows`).")


def test_the_history_search_report_says_what_ran_what_it_found_and_each_reason_once():
    found = {"seed": 7, "budget": 600, "deepspeed": {"histories": 12, "rounds": 2, "seconds": 300, "found": [
        {"record": {}, "findings": [{"step": 3, "kind": "outcome", "signature": "wrong at train",
                                     "detail": "the series is wrong (" + LONG + ") where the release is exact"}]}],
        "entries": [{"id": "deepspeed-history-1", "config": {"processes": "2", "workers": "2", "clusters": "schedule"},
                     "words": "processes 2, workers 2, clusters schedule; 1. train 1 optimizer steps"}]}}
    stored = [{"id": f"deepspeed-history-{n}", "config": {"processes": "1", "workers": "0", "clusters": "single"},
               "words": "processes 1", "signatures": ["wrong at train"], "status": "known", "reason": REASON}
              for n in (2, 3)]
    text = histories_report.markdown(found, {"deepspeed": stored}, {"deepspeed": ABOUT})
    lines = text.splitlines()
    assert lines[0] == "# History search: the kit's stacks on DeepSpeed 0.19.8"
    assert "seed 7, a budget of 600 s" in lines[2] and "#8787" in lines[2]
    assert lines[6] == ("- DeepSpeed: 12 histories in 2 rounds, 300 s: 1 regressions found; 2 stored histories, "
                        "which `make test` replays (2 known)")
    assert "`make fuzz FUZZ_SEED=7 FUZZ_SECONDS=600`" in text and LONG in text
    assert text.count(REASON.strip()) == 1 and text.count("(known: R1)") == 2
    glossary = text[text.index("## Glossary"):]
    for factor, level in (("processes", "2"), ("workers", "0"), ("clusters", "schedule")):
        assert f"`{level}`: {factors.FACTOR_WORDS['deepspeed'][factor][level]}" in glossary


def test_at_is_said_one_way_in_the_readme_make_help_and_the_flows_command():
    """The README's variables table, ``make help`` (``ABOUT_AT``) and ``python -m scripts.flows --help`` say AT in the
    same words, and name each stack's first commit alone as HEAD~(its commits - 1)."""
    from scripts.flows.__main__ import AT_HELP

    readme = (KIT_ROOT / "README.md").read_text()
    makefile = (KIT_ROOT / "Makefile").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `AT` |"))
    about = re.search(r"^ABOUT_AT := (.*)$", makefile, re.M).group(1)
    assert about == AT_HELP
    assert row.split(" | ")[2].replace("`", "") == AT_HELP
    for name, title in (("accelerate", "Accelerate"), ("deepspeed", "DeepSpeed")):
        commits = len(list((KIT_ROOT / "patches" / name).glob("*.patch")))
        assert re.search(fr"{title}'s( first commit alone is)? HEAD~{commits - 1} \(a stack of {commits}\)", AT_HELP)
