"""The bench's targets and its verdict: pure functions of the figures the parts measured (report.json's entries).

A target is a figure the series can change, with a bound from issues 7 and 12: ``prepare()`` at ``num_workers=6``
at least 20x faster with no worker started (the Accelerate fix's gain); prepare() + epoch 0 (the same work on both
sides) at most 5 % slower per ``num_workers``; DeepSpeed's CPU time per sampler micro-batch and per ``state_dict()``
+ ``load_state_dict()`` at most 5 % more per scenario (the series changes the sampler's iterator and its state);
the gate at most 3 F. Figures the series cannot change (Accelerate's epoch 1) or that do not compare the same work
(epoch 0 alone: the patched side starts the workers there, the base in prepare()) are shown, not judged; the wall
clock figures beside the CPU ones are shown too, as the CPU ones are the ones a busy machine does not inflate.

Each target is judged on its per-repetition values (adjacent base / patched processes, or one gate and its floor),
against a one-sided bound: *met* when every repetition is on the good side, *not met* when every one is on the bad
side, and *within noise* when the repetitions fall on both sides. A target within noise names the repetitions per
side that would decide it: n with 2 s / sqrt(n) < d, s the standard deviation of the values and d the distance of
their median from the bound (a normal approximation of the 95 % interval of their mean).
"""

import math
import statistics

MET, NOT_MET, NOISE = "met", "not met", "within noise"
ORDER = (MET, NOISE, NOT_MET)  # the worst of several values decides a target of several figures
MOST = 99  # repetitions beyond which "would decide it" is reported as "more than 99"
PREPARE_SPEEDUP = 20.0
COST = 1.05  # patched / base of a time: at most 5 % more
GATE_OVER_F = 3.0
WARM_GATE = 0.15  # a gate with nothing changed / a cold gate, wall and CPU: at most 15 % (issue 42)
FLOWS_COST = 1.25  # make test with the pairwise flows after a series edit / without them, in CPU time (issues 39, 52)


def decide(values: list[float], bound: float, lower_is_better: bool) -> tuple[str, int | None]:
    """(verdict, repetitions per side that would decide it or None) of per-repetition ``values`` against ``bound``.

    ``lower_is_better``: the good side is ``value <= bound`` (else ``value >= bound``). Only a verdict within noise
    has a number of repetitions; it is None there when the median lies on the bound (no number decides it), and
    MOST + 1 when more than MOST would be needed.
    """
    good = [(v <= bound) if lower_is_better else (v >= bound) for v in values]
    if all(good):
        return MET, None
    if not any(good):
        return NOT_MET, None
    distance = abs(statistics.median(values) - bound)
    if distance == 0:
        return NOISE, None
    needed = math.ceil((2 * statistics.stdev(values) / distance) ** 2)
    return NOISE, min(max(needed, len(values) + 1), MOST + 1)


def worst(verdicts: list[tuple[str, int | None]]) -> tuple[str, int | None]:
    """The verdict of a target judged on several figures: the worst one; within noise, the most repetitions."""
    verdict = max((v for v, _ in verdicts), key=ORDER.index)
    repeats = [n for v, n in verdicts if v == NOISE]
    return verdict, (None if verdict != NOISE or None in repeats else max(repeats, default=None))


def ratios(entry: dict) -> list[float]:
    """The per-repetition ratios patched / base of a ``common.compare`` entry (a base of 0 left out)."""
    return [p / b for b, p in zip(entry["base_runs"], entry["patched_runs"], strict=True) if b]


def spread(values: list[float], digits: int = 3) -> str:
    """``median [min-max]`` of ``values``."""
    near = min(digits, 2)
    return f"{statistics.median(values):.{digits}f} [{min(values):.{near}f}-{max(values):.{near}f}]"


def row(goal: str, measured: str, judged: tuple[str, int | None]) -> dict:
    """A target row: {"goal", "measured", "verdict", "repeat"} (``repeat``: see ``decide``)."""
    return {"goal": goal, "measured": measured, "verdict": judged[0], "repeat": judged[1]}


def accelerate_targets(acc: dict) -> list[dict]:
    """The Accelerate targets of a ``upstreams.bench_accelerate`` result."""
    nw6 = acc["by_workers"]["6"]
    speedups = [1 / r for r in ratios(nw6["prepare_s"]) if r]
    workers = max(nw6["workers_after_prepare"]["patched_runs"])
    judged = decide(speedups, PREPARE_SPEEDUP, lower_is_better=False) if not workers else (NOT_MET, None)
    rows = [row(f"Accelerate prepare() at num_workers=6: at least {PREPARE_SPEEDUP:g}x faster than the base, no "
                "worker process started", f"{spread(speedups, 1)}x faster, "
                + ("no worker started" if not workers else f"up to {workers:g} workers started"), judged)]
    per_nw = {nw: ratios(entry["prepare_epoch0_s"]) for nw, entry in acc["by_workers"].items()}
    rows.append(row(f"Accelerate prepare() + epoch 0: patched / base at most {COST:.2f} (num_workers "
                    f"{', '.join(per_nw)})", "; ".join(f"nw {nw}: {spread(v)}" for nw, v in per_nw.items()),
                    worst([decide(v, COST, lower_is_better=True) for v in per_nw.values()])))
    return rows


def deepspeed_targets(ds: dict) -> list[dict]:
    """The DeepSpeed targets of a ``upstreams.bench_deepspeed`` result (CPU times)."""
    rows = []
    for metric, label in (("batch_cpu_s", "CPU time per sampler micro-batch"),
                          ("state_roundtrip_cpu_s", "CPU time of state_dict() + load_state_dict()")):
        per = {scenario: ratios(entry[metric]) for scenario, entry in ds["by_scenario"].items()}
        rows.append(row(f"DeepSpeed {label}: patched / base at most {COST:.2f} ({', '.join(per)})",
                        "; ".join(f"{scenario}: {spread(v)}" for scenario, v in per.items()),
                        worst([decide(v, COST, lower_is_better=True) for v in per.values()])))
    return rows


def gate_targets(gate: dict) -> list[dict]:
    """The targets of a ``gate.bench_gate`` result: gate <= 3 F, per repetition; a warm gate (its stage results
    reused) at most WARM_GATE of the cold one, in wall and in CPU time (each ratio must be on the good side)."""
    values = [r["gate"]["seconds"] / r["F_s"] for r in gate["runs"]]
    rows = [row(f"the gate at most {GATE_OVER_F:g} F", f"{spread(values, 2)} F",
                decide(values, GATE_OVER_F, lower_is_better=True))]
    reuse = gate.get("reuse")
    if reuse:
        warm = [v for v in (reuse["warm_wall_ratio"], reuse["warm_cpu_ratio"]) if v is not None]
        rows.append(row(f"a gate with nothing changed at most {WARM_GATE:g} of a cold one (wall, CPU)",
                        " and ".join(f"{v:.3f}" for v in warm), decide(warm, WARM_GATE, lower_is_better=True)))
    return rows


def flows_targets(flows: dict) -> list[dict]:
    """The targets of a ``flows.bench_flows`` result, one per upstream: ``make test``'s CPU after a one-line edit to
    that upstream's series / the same without the flow table, per repetition (none without repetitions)."""
    rows = []
    for edit in sorted(k for k in (flows["test"] or [{}])[0] if k.startswith("edit ")):
        values = [r[edit]["cpu_s"] / r[f"without {edit.removeprefix('edit ')}"]["cpu_s"] for r in flows["test"]]
        rows.append(row(f"make test's CPU time after an edit to {edit.removeprefix('edit ')}'s series at most "
                        f"{FLOWS_COST:g}x without the flow table", f"{spread(values, 2)}x",
                        decide(values, FLOWS_COST, lower_is_better=True)))
    return rows


def targets(doc: dict) -> list[dict]:
    """Every target of the parts ``doc`` holds (``accelerate``, ``deepspeed``, ``gate``, ``flows``), in that order."""
    rows = []
    for key, judge in (("accelerate", accelerate_targets), ("deepspeed", deepspeed_targets), ("gate", gate_targets),
                       ("flows", flows_targets)):
        if doc.get(key):
            rows += judge(doc[key])
    return rows


def repeat_text(row: dict) -> str:
    """What would decide a target within noise, in words ('' for another verdict)."""
    if row["verdict"] != NOISE:
        return ""
    if row["repeat"] is None:
        return "no number of repetitions decides it (the median lies on the bound)"
    if row["repeat"] > MOST:
        return f"more than {MOST} repetitions per side would decide it"
    return f"about {row['repeat']} repetitions per side would decide it"


def cell(row: dict) -> str:
    """A target's verdict in words: ``met``, ``not met``, or ``within noise (about N repetitions ...)``."""
    more = repeat_text(row)
    return f"{row['verdict']} ({more})" if more else row["verdict"]


def overall(rows: list[dict], errors: list[str], interrupted: str) -> tuple[str, bool]:
    """(the bench's one verdict line, True when it fails: a target not met or a part not measured)."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ORDER}
    parts = [f"{counts[MET]} of {len(rows)} targets met"]
    if counts[NOISE]:
        most = [r["repeat"] for r in rows if r["verdict"] == NOISE]
        decide_with = ("; more repetitions would decide them (BENCH_ARGS='--repeat N', N as each target says)"
                       if None in most or max(most) > MOST else
                       f"; BENCH_ARGS='--repeat {max(most)}' would decide them")
        parts.append(f"{counts[NOISE]} within noise{decide_with}")
    if counts[NOT_MET]:
        parts.append(f"{counts[NOT_MET]} not met: " + "; ".join(r["goal"] for r in rows if r["verdict"] == NOT_MET))
    if errors:
        parts.append(f"{len(errors)} parts not measured (see Errors)")
    if interrupted:
        parts.append(f"interrupted {interrupted}")
    failed = bool(counts[NOT_MET] or errors)
    return f"{'FAIL' if failed else 'PASS'}: " + ", ".join(parts), failed
