"""The history search's report, ``build/histories/report.md``: a pure function of the search's record
(``build/histories/found.json``), the stored histories (``tests/histories/<upstream>.json``) and what each upstream's
run was (``about``, as in the flow table's report: the release, the upstream's URL and the stack's commits).

It reads on its own, as the flow table's report does: a header naming the upstreams, the releases and the issues the
stacks fix; one summary line per upstream; what was found, whole; each stored history once, with its status and
reason (each reason once, cited by a key); and the glossary of every configuration level used
(``factors.FACTOR_WORDS``, the flow table's, which holds the history search's levels too).
"""

from scripts.flows import factors
from scripts.flows.report import REASON, STATUS_WORDS, TITLES, stack_words


def summary_line(upstream: str, result: dict, stored: list[dict]) -> str:
    """One line per upstream: the histories run, in how many rounds and seconds, the regressions found, and the
    stored histories ``make test`` replays."""
    found = result.get("entries") or result.get("found") or []
    known = sum(e.get("status") == "known" for e in stored)
    accepted = sum(e.get("status") == "accepted" for e in stored)
    listed = ", ".join(f"{n} {status}" for n, status in ((known, "known"), (accepted, "accepted")) if n)
    return (f"{TITLES.get(upstream, upstream)}: {result['histories']} histories in {result['rounds']} rounds, "
            f"{result['seconds']} s: " + (f"{len(found)} regressions found" if found else "no regression found")
            + f"; {len(stored)} stored histories, which `make test` replays" + (f" ({listed})" if listed else ""))


def _config_levels(config: dict) -> dict[str, set]:
    return {key: set(value if isinstance(value, list) else [value]) for key, value in config.items()}


def glossary(used: dict[str, dict[str, set]]) -> list[str]:
    """The words of every configuration level used (``used``: upstream -> factor -> levels), from
    ``factors.FACTOR_WORDS``."""
    md = ["## Glossary", "",
          "**Sides**: *the release* runs the pristine release; *the stack* runs the release with the kit's commits. "
          "Each side runs beside the *uninterrupted model*: the same job without saves, `state_dict()` calls or "
          "crashes, whose batches are the truth.", "",
          "**Outcomes of a step**, best first: *exact*; *refused* (a clear error of the upstream's at a load); "
          "*warned* (wrong after a restart that logged a warning saying what it could not restore); *wrong* "
          "(silently); *uneven* (the processes read different numbers of batches); *hang*; *crash*.", "",
          "**Findings** (what makes a history a regression): *outcome*: at a step the stack does worse than the "
          "release; *effects*: a prepare, `state_dict()`, save or load of the stack starts DataLoader workers, or "
          "runs the sampler's `__iter__` or the dataset's `set_epoch`, more often than the release's; *stale "
          "files*: a save of the stack leaves files of an earlier save in its folder that the release's folder does "
          "not hold.", "",
          f"**Statuses** of a stored history: none (`make test` fails on any finding); {STATUS_WORDS}. Either way "
          "with a reason, and its listed findings do not fail the suite.", "",
          "**Configuration levels** (`FACTOR_WORDS` in `scripts/flows/factors.py`), those used above:", ""]
    for upstream, by_factor in used.items():
        words = factors.FACTOR_WORDS.get(upstream, {})
        md.append(f"- {TITLES.get(upstream, upstream)}:")
        for factor, levels in by_factor.items():
            said = words.get(factor, {})
            md.append(f"  - `{factor}`: " + "; ".join(
                f"`{level}`: {said.get(level, '(no words in FACTOR_WORDS)')}"
                for level in sorted(levels, key=lambda lv: list(said).index(lv) if lv in said else len(said))))
    return [*md, ""]


def markdown(found: dict, stored: dict[str, list[dict]], about: dict[str, dict]) -> str:
    """The report of one ``make fuzz`` run (``found``: ``build/histories/found.json``: its seed, budget and, per
    upstream, the search's result and the entries it made of what it found), with the stored histories of each
    upstream (``stored``) and what each upstream's sides were (``about``)."""
    upstreams = [u for u in about if u in found]
    names = " and ".join(f"{TITLES.get(u, u)} {about[u]['release']}" for u in upstreams)
    budget = f", a budget of {found['budget']:.0f} s" if found.get("budget") else ""
    lines = [f"# History search: the kit's stacks on {names}", "",
             "What was searched: histories of a training job (its start, then up to 14 steps a user's script takes: "
             "reading batches, `set_epoch`, `state_dict()`, saves of each kind into new or used folders, crashes and "
             f"restarts from the newest or an older save) drawn by Hypothesis from seed {found['seed']}{budget}, "
             "each run on the release and on the stack beside the uninterrupted model, and judged after every step. "
             + " ".join(f"The {TITLES.get(u, u)} stack: {about[u]['release']} with the kit's "
                        f"{len(about[u]['stack'])} commits, which fix {stack_words(about[u])}." for u in upstreams),
             "", "What it found:", ""]
    lines += [f"- {summary_line(u, found[u], stored.get(u, []))}" for u in upstreams]
    replay = f" FUZZ_SECONDS={found['budget']:.0f}" if found.get("budget") else ""
    lines += ["", f"The same search again: `make fuzz FUZZ_SEED={found['seed']}{replay}`. Below: what it found, the "
              "stored histories, the reasons of those with a status, and the glossary.", "", "## Found", ""]
    used: dict[str, dict[str, set]] = {}
    for u in upstreams:
        for entry in found[u].get("entries", []):
            for factor, levels in _config_levels(entry["config"]).items():
                used.setdefault(u, {}).setdefault(factor, set()).update(levels)
        for item, entry in zip(found[u].get("found", []), found[u].get("entries", []), strict=False):
            lines += [f"### {entry['id']}", "", f"{TITLES.get(u, u)}: {entry['words']}", ""]
            lines += [f"- step {f['step']}: {f['kind']}: {f['detail']}" for f in item["findings"]]
            lines.append("")
    if not any(found[u].get("entries") for u in upstreams):
        lines += ["Nothing: no history did worse on the stack than on the release.", ""]
    keys: dict[str, str] = {}
    lines += ["## Stored histories", "", "`tests/histories/<upstream>.json`: each history a search found, shrunk; "
              "`make test` replays them all on the release and the stack.", ""]
    for u in upstreams:
        for entry in stored.get(u, []):
            for factor, levels in _config_levels(entry["config"]).items():
                used.setdefault(u, {}).setdefault(factor, set()).update(levels)
            status = ""
            if entry.get("status"):
                key = keys.setdefault(entry["reason"], f"{REASON}{len(keys) + 1}")
                status = f" ({entry['status']}: {key})"
            lines.append(f"- `{entry['id']}`{status}: {entry['words']}. Found as: "
                         f"{', '.join(entry.get('signatures', [])) or 'none recorded'}.")
        if not stored.get(u):
            lines.append(f"- {TITLES.get(u, u)}: none.")
    lines += ["", "## Reasons", ""]
    lines += [f"- **{key}**: {reason}" for reason, key in keys.items()] or ["None."]
    lines += ["", *glossary(used)]
    return "\n".join(lines)
