"""Judge the flow table: from the ranks' records of a flow to an outcome per column, the release against the series.

Pure functions of the records ``scripts/flows/run.py`` collects (no file, no process). Outcomes, from best to worst:

- ``exact``: the restarted job reads what the uninterrupted job reads after the checkpoint, on every process (with
  another number of processes at load: the same samples, each once, in every pass), and the uninterrupted job reads
  each sample once per epoch across the processes; ``order`` flows: the order of every reference;
- ``error``: the restart refuses, with an exception of the upstream's before any batch is read (a clear refusal:
  fine where the release cannot resume the flow either); an ``AttributeError``, ``KeyError``, ``TypeError``,
  ``IndexError``, ``NameError`` or ``UnboundLocalError`` there is a bug, not a refusal: ``crash``;
- ``warned``: what the restart reads is wrong, and it logged a warning naming what it could not restore (the history
  search tells it from a silent ``wrong``);
- ``wrong``: anything else the processes read, said in numbers (batches that differ, samples read twice or never);
- ``uneven``: the processes read different numbers of batches in one pass: a DDP job hangs in its next collective;
- ``hang``: a task did not finish in its time; ``crash``: it raised after reading, or its process died.

A column's outcome is the worst of its parts' (the uninterrupted run, the saving run, each pass of the restart). A flow
is a ``regression`` when the series' outcome, or that of one part, is worse than the release's: a refusal where the
release resumes exactly counts (the issue's rule counts only wrong, uneven, hang and crash; a series that refused
every load would pass it), ``fixed`` when the series is ``exact`` and the release is not.
"""

import re
from collections import Counter

ORDER = ("exact", "error", "warned", "wrong", "uneven", "hang", "crash")  # best first
RANK = {"exact": 0, "error": 1, "warned": 2, "wrong": 3, "uneven": 4, "hang": 4, "crash": 4}
BUGS = ("AttributeError", "KeyError", "TypeError", "IndexError", "NameError", "UnboundLocalError")
# The last line of a rank's crash when a peer ended first (Gloo): a consequence, not the cause
PEER_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe")


def crash_line(record: dict) -> str:
    """The last line of a record's ``crash`` (the exception a traceback ends in); '' when it has none."""
    lines = record.get("crash", "").strip().splitlines()
    return lines[-1] if lines else ""


def lost_peer(record: dict) -> bool:
    """Whether a record's crash is a lost peer (it ended because another rank did)."""
    return bool(PEER_LOST.search(crash_line(record)))


def failure(records: list[dict | None], what: str) -> tuple[str, str] | None:
    """``(crash | hang, detail)`` when a rank of a part crashed, hung or wrote no record (in that order: a crash is
    what its peers then wait for; of crashes, one that is not a lost peer first, as the cause); None when every rank
    has a result (or an ``error``)."""
    ordered = sorted(enumerate(records), key=lambda item: item[1] is not None and lost_peer(item[1]))
    for kind in ("crash", "hang"):
        for rank, record in ordered:
            if record is not None and kind in record:
                lines = record[kind].strip().splitlines() or [""]
                said = [line for line in lines if "Error" in line or "Exception" in line] or lines
                return kind, f"{what}: process {rank}: {said[-1].strip()[:200]}"
    for rank, record in enumerate(records):
        if record is None:
            return "crash", f"{what}: process {rank} wrote no record"
    return None


def _flat(batches):
    return [i for batch in batches for i in batch]


def compare(expected: list, got: list, what: str) -> str | None:
    """Numbers of how ``got`` (batches of sample ids) differs from ``expected``; None when equal."""
    if got == expected:
        return None
    want, seen = Counter(_flat(expected)), Counter(_flat(got))
    differing = sum(a != b for a, b in zip(expected, got, strict=False)) + abs(len(expected) - len(got))
    twice = sum((seen - want).values())
    never = sum((want - seen).values())
    return (f"{what}: {len(got)} batches read for {len(expected)}, {differing} differ; {twice} samples read "
            f"beyond the uninterrupted run, {never} of its samples never")


def _compare_samples(expected_by_rank: list, got_by_rank: list, what: str) -> str | None:
    """How the samples all processes read differ from the samples all processes of the uninterrupted run read (as
    multisets: another number of processes reads them in other batches); None when they are the same."""
    want = Counter(i for batches in expected_by_rank for i in _flat(batches))
    seen = Counter(i for batches in got_by_rank for i in _flat(batches))
    if want == seen:
        return None
    return (f"{what}: {sum(seen.values())} samples read for {sum(want.values())}, {sum((seen - want).values())} "
            f"beyond the uninterrupted run, {sum((want - seen).values())} of its samples never")


def _partition(epochs_by_rank: list[list], num_samples: int) -> str | None:
    """Where the uninterrupted job does not read each sample once per epoch across the processes; None if it does."""
    for e in range(min(len(epochs) for epochs in epochs_by_rank)):
        counts = Counter(i for epochs in epochs_by_rank for i in _flat(epochs[e]))
        twice = sum(n - 1 for n in counts.values() if n > 1)
        never = num_samples - len(counts)
        if twice or never:
            return f"the uninterrupted run's epoch {e} reads {twice} samples twice and {never} never"
    return None


def resume_parts(save: list[dict | None], load: list[dict | None], num_samples: int) -> dict[str, tuple[str, str]]:
    """The outcome of each part of one column of a resume flow, ``{part: (outcome, detail)}``: the uninterrupted
    run (each sample once per epoch across the processes, unless its record says ``"partition": false``), the saving
    run (what it read before and after its checkpoint is what the uninterrupted run read), and the restart's passes
    (``the rest of the epoch`` unless the checkpoint was ``at_end`` of it, ``the next epoch`` where the truth has
    one), or ``the restart`` when it refused, hung or crashed.

    ``save``: one record per saving process: ``truth`` (the uninterrupted run: epochs of batches of sample ids),
    ``epoch`` and ``step`` (where the checkpoint was taken), ``at_end``, ``before`` / ``after`` (what the saving run
    read); ``load``: one per restarted process: ``loops`` (its passes) and ``warnings`` (what the load logged; a
    wrong pass after one is ``warned``), or ``error`` (with ``raised_here``), or
    ``hang`` / ``crash``; None for a process that wrote none."""
    failed = failure(save, "the saving run")
    if failed:
        return {"the saving run": failed}
    parts = {}
    if save[0].get("partition", True):
        parts["the uninterrupted run"] = _wrong(_partition([r["truth"] for r in save], num_samples))
    epoch, step = save[0]["epoch"], save[0]["step"]
    lengths = [len(r["before"]) + len(r["after"]) for r in save]
    if len(set(lengths)) > 1:
        parts["the saving run"] = ("uneven", f"the saving run: the processes read {lengths} batches in the epoch of "
                                             "its checkpoint")
    else:  # to the end of the epoch, or where the record says the saving run ends (it dies there)
        parts["the saving run"] = _wrong("; ".join(filter(None, (
            compare(r["truth"][epoch][:r.get("saving_run_ends", len(r["truth"][epoch]))], r["before"] + r["after"],
                     f"the checkpoint changed the saving run on process {i}") for i, r in enumerate(save)))))
    failed = failure(load, "the restarted run")
    if failed:
        return {**parts, "the restart": failed}
    if any("error" in record for record in load):
        errors = sorted({record["error"] for record in load if record.get("raised_here")}) or [
            next(record["error"] for record in load if "error" in record)]
        kind = "crash" if any(error.startswith(BUGS) for error in errors) else "error"
        return {**parts, "the restart": (kind, "the restart raised: " + "; ".join(errors))}
    passes = [] if save[0]["at_end"] else [("the rest of the epoch", [r["truth"][epoch][step:] for r in save])]
    if len(save[0]["truth"]) > epoch + 1:
        passes.append(("the next epoch", [r["truth"][epoch + 1] for r in save]))
    if not passes:
        raise ValueError("a save record with nothing after its checkpoint to judge the restart by")
    warned = any(record.get("warnings") for record in load)
    for index, (what, wanted) in enumerate(passes):
        got = [r["loops"][index] for r in load]
        lengths = [len(batches) for batches in got]
        if len(set(lengths)) > 1:
            parts[what] = ("uneven", f"{what}: the processes read {lengths} batches")
        elif len(save) == len(load):
            parts[what] = _wrong("; ".join(filter(None, (
                compare(wanted[rank], got[rank], f"{what} on process {rank}") for rank in range(len(load))))), warned)
        else:
            parts[what] = _wrong(_compare_samples(wanted, got, f"{what}, all processes together"), warned)
    return parts


def _wrong(detail: str | None, warned: bool = False) -> tuple[str, str]:
    """``exact`` without a detail; else ``wrong``, or ``warned`` when the restart logged a warning (``warnings`` in a
    load record: what the upstream said it could not restore)."""
    if not detail:
        return "exact", ""
    return ("warned", detail + " (the restart warned: it said so)") if warned else ("wrong", detail)


def worst(parts: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """A column's outcome: the worst of its parts', with the details of every part that is not exact."""
    outcome = max((o for o, _ in parts.values()), key=ORDER.index)
    return outcome, "; ".join(d for o, d in parts.values() if o != "exact" and d)


def order_outcome(records: list[dict | None]) -> tuple[str, str]:
    """The outcome of one column of an order flow: the stateful loader's epochs against each reference's."""
    failed = failure(records, "the run")
    if failed:
        return failed
    problems = []
    for rank, record in enumerate(records):
        for name, reference in record["references"].items():
            for e, (got, wanted) in enumerate(zip(record["stateful"], reference, strict=True)):
                if got != wanted:
                    equal = sum(a == b for a, b in zip(_flat(got), _flat(wanted), strict=False))
                    problems.append(f"epoch {e} on process {rank}: {equal} of {len(_flat(wanted))} positions as "
                                    f"the {name}'s")
    return ("wrong", "; ".join(problems[:4])) if problems else ("exact", "")


def release_order_outcome(records: list[dict | None], release: list[dict | None]) -> tuple[str, str]:
    """The outcome of the series column of a ``release-order`` flow: its uninterrupted ``run`` (batches of sample
    ids, per process) against the release column's; exact when the series runs a job the release cannot (there is no
    order of the release to keep)."""
    failed = failure(records, "the run")
    if failed:
        return failed
    if failure(release, "the release's run"):
        return "exact", ""
    problems = [compare(r["run"], s["run"], f"process {rank} against the release")
                for rank, (s, r) in enumerate(zip(records, release, strict=True))]
    return _wrong("; ".join(filter(None, problems)))


def outcome(kind: str, parts: dict, num_samples: int, release: dict | None = None) -> dict[str, tuple[str, str]]:
    """One column's parts (see ``resume_parts``) from its records (``{"save": [...], "load": [...]}`` or
    ``{"order": [...]}``); an order flow has one part, ``the order``. A ``release-order`` flow compares the column's
    run with the release column's (``release``: its records; None for the release column itself, which is exact
    when it ran)."""
    if kind == "order":
        return {"the order": order_outcome(parts["order"])}
    if kind == "release-order":
        if release is None:
            return {"the order": failure(parts["order"], "the run") or ("exact", "")}
        return {"the order": release_order_outcome(parts["order"], release["order"])}
    return resume_parts(parts["save"], parts["load"], num_samples)


def verdict(release: dict, series: dict) -> str:
    """``regression``, ``fixed`` or ``same`` for the two columns' parts of a flow: a regression when the series'
    outcome, or that of a part both columns have, ranks worse than the release's (``RANK``); fixed when the series
    is exact and the release is not."""
    release_outcome, series_outcome = worst(release)[0], worst(series)[0]
    shared = release.keys() & series.keys()
    if RANK[series_outcome] > RANK[release_outcome] or any(RANK[series[p][0]] > RANK[release[p][0]] for p in shared):
        return "regression"
    if series_outcome == "exact" and release_outcome != "exact":
        return "fixed"
    return "same"


def listed(flow_factors: dict, entries: list[dict]) -> dict | None:
    """The first entry of a list of known or accepted differences whose ``match`` (factor: level, or factor: list
    of levels) the flow's factors satisfy; None when none does."""
    for entry in entries:
        match = entry["match"]
        if all(flow_factors.get(k) in (v if isinstance(v, list) else [v]) for k, v in match.items()):
            return entry
    return None


def table(flows: list[dict], results: dict, num_samples: int, known: list[dict], reused: dict | None = None
          ) -> list[dict]:
    """One row per flow: its factors, each column's outcome and detail, the verdict, the list entry that names it (a
    regression without one fails the suite) and ``release_reused`` / ``series_reused``: when that column's reused
    records ran (``reused``: {(flow id, column): that time}; '' for a column run now)."""
    rows = []
    for flow in flows:
        release = results[(flow["id"], "release")]
        parts = {"release": outcome(flow["kind"], release, num_samples),
                 "series": outcome(flow["kind"], results[(flow["id"], "series")], num_samples, release)}
        row = {"id": flow["id"], "kind": flow["kind"], "factors": flow["factors"], "verdict": verdict(**parts),
               **{f"{c}_reused": (reused or {}).get((flow["id"], c), "") for c in ("release", "series")}}
        for column in ("release", "series"):
            row[column], row[f"{column}_detail"] = worst(parts[column])
            row[f"{column}_parts"] = {part: o for part, (o, _) in parts[column].items()}
        entry = listed(flow["factors"], [e for e in known if e.get("kind", "resume") == flow["kind"]])
        row["listed"] = entry["reason"] if entry and row["verdict"] == "regression" else ""
        rows.append(row)
    return rows


def unused(rows: list[dict], entries: list[dict]) -> list[dict]:
    """The entries of the known and accepted differences that name no regression of ``rows`` (to remove, once the
    change they wait for has landed)."""
    regressions = [row for row in rows if row["verdict"] == "regression"]
    return [entry for entry in entries
            if not any(row["kind"] == entry.get("kind", "resume") and listed(row["factors"], [entry])
                       for row in regressions)]


def summary(rows: list[dict]) -> dict:
    """Counts of one upstream's table: flows run, exact on each column, regressions (listed or not), fixed,
    columns reused (each of the release and the series)."""
    return {
        "flows": len(rows),
        "release_exact": sum(r["release"] == "exact" for r in rows),
        "series_exact": sum(r["series"] == "exact" for r in rows),
        "regressions": sum(r["verdict"] == "regression" for r in rows),
        "unlisted_regressions": sum(r["verdict"] == "regression" and not r["listed"] for r in rows),
        "fixed": sum(r["verdict"] == "fixed" for r in rows),
        "release_reused": sum(bool(r.get("release_reused")) for r in rows),
        "series_reused": sum(bool(r.get("series_reused")) for r in rows),
        "outcomes": {c: dict(Counter(r[c] for r in rows)) for c in ("release", "series")},
    }


# The kinds of flow a report counts apart (``group``), in the order it shows them
GROUPS = ("series", "rollback", "upgrade", "order", "own-fault")


def own_fault(row: dict) -> bool:
    """Whether a row's uninterrupted run is itself wrong on both columns, whichever code ran it: the job's own doing
    (its seeding: processes that draw different orders read some samples twice), not a fault of a resume, nor of the
    code under test (an uninterrupted run wrong on the release alone is the release's)."""
    return all(row.get(f"{column}_parts", {}).get("the uninterrupted run", "exact") != "exact"
               for column in ("release", "series"))


def group(row: dict) -> str:
    """The kind of flow a row counts under (``GROUPS``): ``own-fault`` (``own_fault``), ``order`` (the ``order`` and
    ``release-order`` kinds: uninterrupted runs), else its ``versions`` level: ``series`` (the stack saves and loads),
    ``rollback`` (the stack saves, the release loads) or ``upgrade`` (the release saves, the stack loads)."""
    if own_fault(row):
        return "own-fault"
    if row["kind"] != "resume":
        return "order"
    return row["factors"].get("versions", "series")


def tally(rows: list[dict]) -> dict:
    """Counts of some rows: flows, each column's outcomes, regressions (and how many no list entry names), fixed."""
    return {"flows": len(rows),
            "release": dict(Counter(r["release"] for r in rows)),
            "series": dict(Counter(r["series"] for r in rows)),
            "regressions": sum(r["verdict"] == "regression" for r in rows),
            "unlisted_regressions": sum(r["verdict"] == "regression" and not r["listed"] for r in rows),
            "fixed": sum(r["verdict"] == "fixed" for r in rows)}


def groups(rows: list[dict]) -> dict:
    """``tally`` of the rows of each kind of flow (``group``), every one of ``GROUPS`` in its order, and of all rows
    (``all``); the kinds' counts add up to all's."""
    return {**{name: tally([r for r in rows if group(r) == name]) for name in GROUPS}, "all": tally(rows)}
