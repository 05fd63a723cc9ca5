"""Judge a history: from the recorded results of its steps to an outcome per side and the findings that make it a
regression.

Pure functions of the record ``scripts/histories/history.py`` writes (no file, no process). A record is
``{"config", "steps": [...]}``; each step is ``{"op", "args", "release": [...],
"series": [...]}`` with one result per rank (None for a side that had stopped). The outcomes are the flow table's
(``scripts/flows/judge.py``), per step:

- ``train``: the subject's batches against the uninterrupted model's on every rank: ``exact``, ``wrong`` (``warned``
  when the restart before it logged a warning naming what it could not restore), ``uneven`` when the ranks read
  different numbers of batches (a DDP job hangs in its next collective);
- ``restart``: ``error`` when the load raised an exception of the upstream's (a clear refusal; the side stops there),
  ``crash`` for a raise that is a bug (``AttributeError``, ``KeyError``, ...);
- any step: ``hang`` or ``crash`` when a rank did not finish or raised.

A history is a regression when, at some step, the series' outcome ranks worse than the release's (a stopped side
keeps the outcome that stopped it, up to the series' next restart: after it the series takes steps the release never
came to, and nothing is compared), or when the series breaks an invariant the release keeps at that step:

- ``effects``: a ``restart`` (prepare and load), ``state_dict()`` or save started DataLoader workers, or ran the
  sampler's ``__iter__`` or the dataset's ``set_epoch``, more often than the release's did (where the release did
  the step: a release that failed in it may have stopped before what it would have run);
- ``stale files``: a save left files of an earlier save in its folder that the release's folder does not hold.
"""

from scripts.flows.judge import BUGS, RANK, compare, failure

EFFECT_OPS = ("restart", "state_dict", "save")
STOPS = ("error", "hang", "crash")  # the outcomes that stop a side
EFFECT_WORDS = {"workers_started": "DataLoader workers started", "sampler_iter": "sampler __iter__ calls",
                "set_epoch": "dataset set_epoch calls"}


def step_outcome(step: dict, results: list[dict], warned: bool) -> tuple[str, str]:
    """One side's outcome of one step and its detail (``warned``: a restart of this segment logged a warning)."""
    failed = failure(results, "the step")
    if failed:
        return failed
    if step["op"] == "restart":
        errors = sorted({r["error"] for r in results if "error" in r})
        if errors:
            return ("crash" if any(e.startswith(BUGS) for e in errors) else "error"), "; ".join(errors)
        return "exact", ""
    if step["op"] != "train":
        return "exact", ""
    got = [r["subject"]["batches"] for r in results]
    lengths = [len(b) for b in got]
    if len(set(lengths)) > 1:
        return "uneven", f"the processes read {lengths} batches"
    problems = [compare(r["model"]["batches"], r["subject"]["batches"], f"process {rank}")
                for rank, r in enumerate(results)]
    problems = [p for p in problems if p]
    if not problems:
        return "exact", ""
    return ("warned" if warned else "wrong"), "; ".join(problems)


def side_outcomes(record: dict, side: str) -> list[tuple[str, str]]:
    """``(outcome, detail)`` of each step for one side; a step after the side stopped repeats the outcome that
    stopped it."""
    out, stopped, warned = [], None, False
    for step in record["steps"]:
        results = step[side]
        if stopped or results is None:
            out.append(stopped or ("crash", "no result, and the side had not stopped"))
            continue
        if step["op"] == "restart":
            warned = any(r.get("warnings") for r in results)
        outcome = step_outcome(step, results, warned)
        out.append(outcome)
        if outcome[0] in STOPS:
            stopped = (outcome[0], f"stopped at step {len(out)}: {outcome[1]}")
    return out


def _effects(step: dict, side: str) -> dict:
    totals = {}
    for result in step[side] or []:
        for key, value in result.get("effects", {}).items():
            totals[key] = totals.get(key, 0) + value
    return totals


def _stale(step: dict, side: str) -> set:
    return {name for result in step[side] or [] for name in result.get("stale", [])}


def _loaded(record: dict, index: int) -> str | None:
    """How the save that the last restart up to step ``index`` loaded was made (None: none loaded one)."""
    for step in reversed(record["steps"][:index + 1]):
        if step["op"] == "restart":
            return step["args"].get("saved_how") if step["args"].get("folder") else None
    return None


def findings(record: dict) -> list[dict]:
    """What makes the history a regression: ``{"step", "kind", "signature", "detail"}`` per finding (``kind``:
    ``outcome``, ``effects`` or ``stale files``; ``signature``: the kind and the step's operation, and for an outcome
    how the save the last restart loaded was made, to tell one kind of failure from another). [] when the series
    does at every step at least what the release does."""
    release, series = side_outcomes(record, "release"), side_outcomes(record, "series")
    found, release_stopped = [], False
    for index, step in enumerate(record["steps"]):
        number = index + 1
        (r_out, r_detail), (s_out, s_detail) = release[index], series[index]
        if release_stopped and step["op"] == "restart":  # the series goes on where the release never came
            break
        release_stopped = release_stopped or r_out in STOPS
        if RANK[s_out] > RANK[r_out]:
            loaded = _loaded(record, index)
            found.append({"step": number, "kind": "outcome",
                          "signature": f"{s_out} at {step['op']}" + (f" (loaded: {loaded})" if loaded else ""),
                          "detail": f"the series is {s_out} ({s_detail}) where the release is {r_out}"
                                    + (f" ({r_detail})" if r_detail else "")})
        # effects are compared with a release that did the step (one that failed there may have stopped before it)
        if step["op"] in EFFECT_OPS and step["series"] is not None and r_out not in STOPS:
            r_eff, s_eff = _effects(step, "release"), _effects(step, "series")
            more = [f"{EFFECT_WORDS[k]} {s_eff[k]} (the release {r_eff.get(k, 0)})"
                    for k in EFFECT_WORDS if s_eff.get(k, 0) > r_eff.get(k, 0)]
            if more:
                found.append({"step": number, "kind": "effects", "signature": f"effects of {step['op']}",
                              "detail": "; ".join(more)})
            extra = sorted(_stale(step, "series") - _stale(step, "release"))
            if step["op"] == "save" and extra:
                found.append({"step": number, "kind": "stale files", "signature": "stale files",
                              "detail": "files of an earlier save left in the folder: " + ", ".join(extra)})
    return found


def outcome(record: dict, side: str) -> str:
    """A side's outcome of the whole history: the worst of its steps'."""
    return max((o for o, _ in side_outcomes(record, side)), key=lambda o: RANK[o], default="exact")
