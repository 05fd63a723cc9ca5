"""The flow table's report: ``build/flows/<name>.md``, ``<name>-details.md`` and ``<name>.json``, pure functions of
the judged rows and of what the run was (``about``: the release, the upstream's URL and the stack's commits).

The report reads on its own: a header naming the upstream, the release and the issues the stack fixes; one summary
line per kind of flow (``judge.GROUPS``), which the gate's report and ``make pr`` cite as they are (``lines`` in the
JSON); the glossary of every factor and level used (``factors.FACTOR_WORDS``); each listed reason once, cited by a
key; the flows whose uninterrupted run is itself wrong apart (the job's own fault); cells that are whole sentences,
the long details in full in ``<name>-details.md``.
"""

from scripts.flows import factors, judge

VERDICT_WORDS = {"regression": "**regression**", "fixed": "fixed", "same": ""}
# The outcomes as the report counts them, every one in every summary line, in this order
SHOWN = ("exact", "error", "warned", "wrong", "uneven", "hang", "crash")  # best first, as the judge ranks them
OUTCOME_WORDS = {"error": "refused"}  # the judge's error: a clear refusal before any batch
CELL = 160  # characters of a detail a cell holds whole; of a longer one, its first whole clauses and a link
REASON = "R"  # the key of a listed reason: R1, R2, ... in the order of the table
TITLES = {"deepspeed": "DeepSpeed", "accelerate": "Accelerate"}  # the upstreams' own spelling
LABELS = {"series": "stack", "own-fault": "own fault"}  # a kind of flow (judge.GROUPS) in a table, if not its name
# What a listed difference's (and a stored history's) status says, in both reports' words
STATUS_WORDS = ("*accepted*: a difference the stack keeps, stated in its commit message; *known*: a regression not "
                "fixed yet, whose reason names the open issue of the kit that tracks it")


def outcome_word(outcome: str) -> str:
    """The report's word for a judge's outcome (``error`` is ``refused``)."""
    return OUTCOME_WORDS.get(outcome, outcome)


def group_words(release: str) -> dict[str, str]:
    """What each kind of flow is (``judge.GROUPS``, and ``all``), in a summary line's words; ``release``: its
    version."""
    return {"all": "all flows", "series": "the stack saves and loads", "rollback": f"rollback ({release} loads "
            "what the stack saved)", "upgrade": f"upgrade (the stack loads what {release} saved)",
            "order": "order (uninterrupted runs, no restart)",
            "own-fault": "the job's own fault (its uninterrupted run is itself wrong, whichever code runs it)"}


def _outcomes(counts: dict) -> str:
    return ", ".join(f"{outcome_word(o)} {counts.get(o, 0)}" for o in SHOWN)


def _regressions(counts: dict) -> str:
    regressions, unlisted = counts["regressions"], counts["unlisted_regressions"]
    if not unlisted:
        return f"regressions {regressions}" + (" (all listed as accepted or known)" if regressions else "")
    return f"regressions {regressions} ({regressions - unlisted} listed as accepted or known, {unlisted} **not**)"


def summary_lines(rows: list[dict], release: str) -> list[str]:
    """One line for all flows, then one per kind of flow (``judge.groups``): the flows, the outcomes on the release
    (``release``: its version) and on the stack, regressions (how many listed) and fixed. The gate's report and
    ``make pr`` cite these lines."""
    words, lines = group_words(release), []
    for name, c in judge.groups(rows).items():
        if not c["flows"]:
            lines.append(f"{words[name]}: no flow")
            continue
        stack = {"rollback": f"the stack saving, {release} loading", "upgrade": f"{release} saving, the stack "
                 "loading"}.get(name, "the stack")
        lines.append(f"{words[name]}: {c['flows']} flows; {release} alone: {_outcomes(c['release'])}; {stack}: "
                     f"{_outcomes(c['series'])}; {_regressions(c)}, fixed {c['fixed']}")
    return lines[-1:] + lines[:-1]  # all flows first


def reuse_line(counts: dict) -> str:
    """How many release and series columns were reused from ``build/flows-cache/`` (``scripts/flows/cache.py``)."""
    return (f"columns reused: release {counts['release_reused']}, series {counts.get('series_reused', 0)} of "
            f"{counts['flows']} each (build/flows-cache; FLOWS_CACHE=0 runs them)")


def _factors(factors: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in factors.items())


def _text(text: str) -> str:
    """Text as it goes into Markdown: one line, a table's ``|`` and an HTML ``<`` escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "\\<")


def head(detail: str, limit: int = CELL) -> str:
    """The first whole clauses of a detail (the judge joins its clauses with ``"; "``), or else its first whole
    sentences, within ``limit`` characters; '' when not even one fits."""
    for separator in ("; ", ". "):
        taken = ""
        for piece in detail.split(separator):
            longer = f"{taken}{separator}{piece}" if taken else piece
            if len(longer) > limit:
                break
            taken = longer
        if taken:
            return taken + ("." if separator == ". " and not taken.endswith(".") else "")
    return ""


def cell(row: dict, column: str, details_file: str) -> str:
    """A column's outcome in whole words: with its detail when that is short; else its first whole clauses (or, when
    none is short, the parts that are not exact) and a link to the detail in full (``details_file``, at the flow's
    id)."""
    outcome, detail = outcome_word(row[column]), " ".join(row[f"{column}_detail"].split())
    if not detail:
        return outcome
    if len(detail) <= CELL:
        return f"{outcome}: {_text(detail)}"
    first = head(detail)
    parts = [part for part, o in row.get(f"{column}_parts", {}).items() if o != "exact"]
    said = f": {_text(first)} ..." if first else f" in {', '.join(parts) or 'some part'}"
    return f"{outcome}{said} ([in full]({details_file}#{row['id']}))"


def reasons(rows: list[dict]) -> dict[str, str]:
    """{reason: its key}: each listed reason once, keyed ``R1``, ``R2``, ... in the order of ``rows``."""
    keys = {}
    for row in rows:
        if row["listed"] and row["listed"] not in keys:
            keys[row["listed"]] = f"{REASON}{len(keys) + 1}"
    return keys


def ordered(rows: list[dict]) -> list[dict]:
    """The rows as the report shows them: regressions first, then fixed, then the same; by kind of flow, then id."""
    verdicts = {"regression": 0, "fixed": 1, "same": 2}
    return sorted(rows, key=lambda r: (verdicts[r["verdict"]], judge.GROUPS.index(judge.group(r)), r["id"]))


def _table(rows: list[dict], release: str, details_file: str, keys: dict) -> list[str]:
    lines = [f"| flow | kind | factors | release {release} | the stack | verdict | reason |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        flow = row["id"]
        if row["release_detail"] or row["series_detail"]:
            flow = f"[{flow}]({details_file}#{flow})"
        kind = judge.group(row)
        lines.append(f"| {flow} | {LABELS.get(kind, kind)} | {_factors(row['factors'])} | "
                     f"{cell(row, 'release', details_file)} | {cell(row, 'series', details_file)} | "
                     f"{VERDICT_WORDS[row['verdict']]} | {keys.get(row['listed'], '')} |")
    return lines


def _offered(commit: dict, url: str) -> str:
    pr = commit.get("proposal_on")
    return f" (the kit's commit goes as a proposal to the open PR [#{pr}]({url}/pull/{pr}))" if pr else ""


def stack_words(about: dict) -> str:
    """The commits of the stack in a sentence: the upstream issues they fix, the follow-ups to file."""
    issues = [c for c in about["stack"] if isinstance(c["key"], int)]
    follow_ups = [c for c in about["stack"] if not isinstance(c["key"], int)]
    said = [f"[#{c['key']}]({about['url']}/issues/{c['key']}){_offered(c, about['url'])}" for c in issues]
    if follow_ups:
        keys = ", ".join(c["key"] + _offered(c, about["url"]) for c in follow_ups)
        said.append(f"{len(follow_ups)} further defect{'s' if len(follow_ups) > 1 else ''} the kit found, whose "
                    f"bug reports are still to be filed upstream ({keys}; their text: `docs/issues/<key>.md` in the "
                    "kit)")
    return " and ".join(said) if said else "its fix"


def _kinds_words(rows: list[dict], release: str) -> str:
    order = []
    if any(r["kind"] == "order" for r in rows):
        order.append("Accelerate's `order` flows run one job for 3 epochs and compare its stateful loader's order "
                     "with a non-stateful prepared loader's and, on one process, a plain DataLoader's (each column "
                     "with its own code)")
    if any(r["kind"] == "release-order" for r in rows):
        order.append(f"DeepSpeed's `release-order` flows compare the stack's uninterrupted run with {release}'s "
                     f"(exact where {release} cannot run the job; the release column is exact when it runs)")
    return ("**Kinds of flow**: *stack*: the stack saves and loads; *rollback* and *upgrade*: as in the columns; "
            "*own fault*: a flow whose uninterrupted run is itself wrong on both columns (the job's own seeding "
            "makes the processes draw different orders), shown apart; *order*: no restart" + "".join(
                f"; {words}" for words in order) + ".")


def glossary(name: str, rows: list[dict], about: dict) -> list[str]:
    """The glossary of a report: the stack's commits, the columns, outcomes and verdicts, the kinds of flow, and every
    factor and level the rows use, in ``factors.FACTOR_WORDS``'s words."""
    release, words = about["release"], factors.FACTOR_WORDS[name]
    md = ["## Glossary", "", f"**The stack**: {TITLES.get(name, name)} {release} with the kit's "
          f"{len(about['stack'])} commits (`patches/{name}/`), each one pull request, merged in this order:", ""]
    md += [f"{n}. {c.get('subject', '')} (`{c['key']}`)" for n, c in enumerate(about["stack"], 1)]
    md += ["", f"**The columns**: *release {release}* runs the pristine release where the job saves and where it "
           f"restarts; *the stack* runs the stack at both ends, except in a rollback (the stack saves, {release} "
           f"loads) and an upgrade ({release} saves, the stack loads). Each column's outcome is the worst of its "
           "parts: the uninterrupted run (the truth: each sample once per epoch), the saving run (a checkpoint must "
           "not change it), then after the restart the rest of the epoch and the next epoch (or *the restart*, when "
           "it refused or crashed); an order flow has one part, *the order*.", "",
           "**Outcomes**, best first: *exact* (the restart reads what the uninterrupted run reads); *refused* (a "
           "clear error of the upstream's before any batch; `error` in the JSON); *warned* (wrong, and the restart "
           "logged a warning saying what it could not restore); *wrong* (silently: batches that differ, samples read "
           "twice or never); *uneven* (the processes read different numbers of batches: a DDP job hangs); *hang*; "
           "*crash* (also a bug's exception, such as a KeyError, at load).", "",
           "**Verdicts**: *regression*: the stack does worse than the release, in the column or in one part (a "
           "refusal where the release is exact counts); `make test` fails on one that "
           "`tests/flows/differences.toml` does not list with a reason. *fixed*: the stack is exact where the "
           "release is not. Blank: neither (the same outcome, or another that ranks no worse, such as wrong on the "
           "release and warned on the stack; the numbers in the cells say how each side did).", "",
           _kinds_words(rows, release), "",
           "**Factors and levels** (`FACTOR_WORDS` in `scripts/flows/factors.py`), those the flows above use:", ""]
    used = {}
    for row in rows:
        for factor, level in row["factors"].items():
            used.setdefault(factor, set()).add(level)
    for factor, levels in used.items():
        said = words.get(factor, {})
        md.append(f"- `{factor}`:")
        for level in sorted(levels, key=lambda lv: list(said).index(lv) if lv in said else len(said)):
            md.append(f"  - `{level}`: {_text(said.get(level, '(no words in FACTOR_WORDS)'))}")
    return [*md, ""]


def header(doc: dict, keys: dict, details_file: str) -> list[str]:
    """The first lines of a report: what was tested (the upstream, its release, the stack and the issues it fixes)
    and the summary lines, one per kind of flow."""
    name, about, rows = doc["upstream"], doc["about"], doc["flows"]
    title, release = TITLES.get(name, name), about["release"]
    at = f"at {doc['at']}, " if doc.get("at") else ""
    lines = [f"# Flow table: {title} {release} and the kit's stack", "",
             f"What was tested: {len(rows)} ways a training job saves a checkpoint and restarts from it (chosen to "
             f"cover {doc['selection']} of the factors in the glossary), each run on the release, {title} {release}, "
             f"and on the stack: {release} with the kit's {len(about['stack'])} commits (`patches/{name}/`, {at}"
             f"commit `{doc['series'][:12]}`), which fix {stack_words(about)}. Every run is compared with the same "
             "job run uninterrupted (the truth)" + (f"; on {about['environment']}" if about.get("environment") else "")
             + ". \"Series\" in the rows and details means the stack.", "",
             f"How each side did, per kind of flow ({release} alone: the job on {release} at save and at restart; "
             "then the stack's side: the stack at both ends, or for a rollback or an upgrade the stack at one end "
             f"and {release} at the other; best first: exact: reads what the uninterrupted run reads; refused: a "
             "clear error before any batch; warned: wrong, and the restart said so; wrong: silently):", ""]
    lines += [f"- {line}" for line in doc["lines"]]
    return lines + ["", f"Below: the flows (regressions first; a flow's id links its details in full, "
                    f"[{details_file}]({details_file})), the job's own faults apart, the reasons of the listed "
                    f"differences ({', '.join(keys.values()) or 'none'}), and the glossary. Columns reused from an "
                    f"earlier run: release {doc['summary']['release_reused']}, series "
                    f"{doc['summary'].get('series_reused', 0)} of {len(rows)} each (`build/flows-cache/`).",
                    ""]


def _own_faults(own: list[dict], release: str, details_file: str, keys: dict) -> list[str]:
    lines = ["## The job's own fault: flows whose uninterrupted run is itself wrong", ""]
    if not own:
        return [*lines, "None: every flow's uninterrupted run reads each sample once per epoch.", ""]
    seeding = sorted({r["factors"]["seeding"] for r in own if "seeding" in r["factors"]})
    why = (f" (their `seeding`: {', '.join(seeding)}: the processes start from different random states and draw "
           "different orders)") if seeding else ""
    lines += [f"The uninterrupted run of these {len(own)} flows does not read each sample once per epoch, on the "
              "release and on the stack alike: the job's own doing, not a fault of a resume or of the code under "
              f"test{why}. The restarts are judged against that run all the same.", ""]
    return [*lines, *_table(own, release, details_file, keys), ""]


def _reasons(doc: dict, keys: dict) -> list[str]:
    statuses = {e["reason"]: e["status"] for e in doc.get("differences", [])}
    lines = ["## Reasons of the listed differences", "",
             f"Each regression that `tests/flows/differences.toml` lists, with its status ({STATUS_WORDS}) and its "
             "reason, once; the rows cite the key.", ""]
    for reason, key in keys.items():
        count = sum(r["listed"] == reason for r in doc["flows"])
        status = f"{statuses[reason]}, " if reason in statuses else ""
        lines.append(f"- **{key}** ({status}{count} flow{'s' if count > 1 else ''}): {_text(reason)}")
    return [*lines, *([] if keys else ["None."]), ""]


def markdown(doc: dict, details_file: str) -> str:
    """The report of one upstream's flows from its JSON document (``document``): the header and the summary lines,
    the table of the flows (regressions first), the job's own faults apart, the reasons, the glossary, and the
    listed differences that match no regression. ``details_file``: the name of the details' file beside it."""
    rows, release = ordered(doc["flows"]), doc["about"]["release"]
    keys = reasons(rows)
    shown = [r for r in rows if not judge.own_fault(r)]
    lines = [*header(doc, keys, details_file), "## The flows", "", *_table(shown, release, details_file, keys), ""]
    lines += _own_faults([r for r in rows if judge.own_fault(r)], release, details_file, keys)
    lines += [*_reasons(doc, keys), *glossary(doc["upstream"], rows, doc["about"])]
    if doc.get("unused_differences"):
        lines += ["## Listed but matching no regression", "",
                  "Entries of tests/flows/differences.toml that match no regression of this selection. An entry "
                  "written for a flow of `FULL=1` (every triple of levels) may match no flow of every pair; a "
                  "`known` entry whose fix has landed is to be removed:", ""]
        lines += [f"- {e['status']}: {e['match']}: {_text(e['reason'])}" for e in doc["unused_differences"]]
        lines.append("")
    return "\n".join(lines)


def details(doc: dict, report_file: str) -> str:
    """Every detail of one upstream's flows in full, a section per flow that has one (its id the anchor the report
    links), each column's parts and what was wrong; ``report_file``: the report's name beside it."""
    name, release = doc["upstream"], doc["about"]["release"]
    keys = reasons(ordered(doc["flows"]))
    lines = [f"# Flow table: {TITLES.get(name, name)} {release}, the details", "",
             f"Each flow whose release or stack column is not exact, in full, in the judge's words "
             f"(`scripts/flows/judge.py`). The report: [{report_file}]({report_file}).", ""]
    for row in ordered(doc["flows"]):
        if not (row["release_detail"] or row["series_detail"]):
            continue
        kind = judge.group(row)
        lines += [f"## {row['id']}", "", f"{LABELS.get(kind, kind)}: {_factors(row['factors'])}; verdict: "
                  f"{row['verdict']}" + (f", listed: {keys[row['listed']]}" if row["listed"] else "")
                  + ("; the job's own fault (its uninterrupted run is itself wrong)" if judge.own_fault(row) else ""),
                  ""]
        for column, label in (("release", f"release {release}"), ("series", "the stack")):
            parts = ", ".join(f"{part} {outcome_word(o)}" for part, o in row.get(f"{column}_parts", {}).items())
            detail = f": {_text(row[f'{column}_detail'])}" if row[f"{column}_detail"].strip() else ""
            lines.append(f"- {label}: {outcome_word(row[column])}{detail}" + (f" (parts: {parts})" if parts else ""))
        lines.append("")
    return "\n".join(lines)


def document(name: str, rows: list[dict], selection: str, series: str, unused: list[dict] = (),
             about: dict | None = None, differences: list[dict] = ()) -> dict:
    """The JSON report of one upstream's flows; ``series``: the commit the checkout held (HEAD); ``about``: the
    release, the upstream's URL and the stack's commits; ``differences``: the list entries of the run. Its
    ``summary`` counts, ``kinds`` counts per kind of flow and ``lines`` are the summary lines the gate's report and
    ``make pr`` cite."""
    about = about or {"release": "the release", "url": "", "stack": []}
    return {"upstream": name, "selection": selection, "series": series, "about": about,
            "summary": judge.summary(rows), "kinds": judge.groups(rows),
            "lines": summary_lines(rows, about["release"]), "differences": list(differences),
            "unused_differences": list(unused), "flows": rows}
