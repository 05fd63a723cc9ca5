"""The flow table's report: ``build/flows/<name>.md`` and ``.json``, pure functions of the judged rows."""

from scripts.flows import judge

VERDICT_WORDS = {"regression": "**regression**", "fixed": "fixed", "same": ""}


def summary_line(name: str, counts: dict) -> str:
    """One line per upstream, as the gate's report and the PR bodies cite it."""
    listed = counts["regressions"] - counts["unlisted_regressions"]
    return (f"{name}: of {counts['flows']} flows the release resumes {counts['release_exact']} exactly, the series "
            f"{counts['series_exact']}; regressions {counts['regressions']} ({listed} listed as known or accepted, "
            f"{counts['unlisted_regressions']} not), fixed {counts['fixed']}")


def reuse_line(counts: dict) -> str:
    """How many release columns were reused from ``build/flows-cache/`` (``scripts/flows/cache.py``)."""
    return (f"release columns reused: {counts['release_reused']} of {counts['flows']} (build/flows-cache; "
            "FLOWS_CACHE=0 runs them)")


def _factors(factors: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in factors.items())


def _cell(outcome: str, detail: str) -> str:
    detail = detail.replace("|", "\\|")
    return f"{outcome}: {detail[:300]}" if detail else outcome


def markdown(name: str, rows: list[dict], counts: dict, selection: str, unused: list[dict] = ()) -> str:
    """The report of one upstream's flows: the summary line first, then one row per flow (regressions first), then
    the listed differences that match no regression (``unused``)."""
    lines = [f"# Flow table: {name}", "", summary_line(name, counts), "", reuse_line(counts) + ".", "",
             f"Flows: {selection}. Outcomes (best first): exact, error (a clear refusal before any batch), warned "
             "(wrong, and the restart logged a warning saying what it could not restore), wrong (silently), "
             "uneven (processes read different numbers of batches: a DDP job hangs), hang, crash. A regression is a "
             "flow the series handles worse than the release; `listed` gives the reason it is known or accepted.", "",
             "| flow | factors | release | series | verdict | listed |", "|---|---|---|---|---|---|"]
    order = {"regression": 0, "fixed": 1, "same": 2}
    for row in sorted(rows, key=lambda r: (order[r["verdict"]], r["id"])):
        release, series = _cell(row["release"], row["release_detail"]), _cell(row["series"], row["series_detail"])
        lines.append(f"| {row['id']} | {row['kind']}: {_factors(row['factors'])} | {release} | {series} | "
                     f"{VERDICT_WORDS[row['verdict']]} | {row['listed']} |")
    outcomes = counts["outcomes"]
    lines += ["", "Outcomes: " + "; ".join(f"{c}: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes[c].items()))
                                         for c in ("release", "series")), ""]
    if unused:
        lines += ["Listed in tests/flows/differences.toml but matching no regression of this selection (an entry "
                  "found by FULL=1 may match none of every pair; else remove it once the change it waits for has "
                  "landed):", ""]
        lines += [f"- {e['status']}: {e['match']}: {e['reason']}" for e in unused]
        lines.append("")
    return "\n".join(lines)


def document(name: str, rows: list[dict], selection: str, series: str, unused: list[dict] = ()) -> dict:
    """The JSON report of one upstream's flows; ``series``: the commit the checkout held (HEAD). The gate's report
    and ``make pr`` cite its ``summary``."""
    return {"upstream": name, "selection": selection, "series": series, "summary": judge.summary(rows),
            "unused_differences": list(unused), "flows": rows}
