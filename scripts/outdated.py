"""``make outdated``: the newest releases on the package index against what the kit pins (issue 30).

``python -m scripts.outdated [--index URL] [--torch SPEC] [--sources FILE] [--constraints FILE] [--out FILE]``

One line per thing the kit pins that upstream releases, then a summary line:

- each upstream of ``upstream/sources.toml``: its newest final release against the default pin (``version``) and
  the releases the file knows (``[<name>.releases]``);
- each dependency axis (``package`` of ``[<name>.matrix]``: torchdata, numpy): its newest final release against the
  lock's version (``requirements/constraints.txt``) and the matrix's ``versions``;
- torch: its newest final release against ``TORCH`` (the Makefile's, ``torch==2.13.0``) and the versions of the
  matrix's torch axes (``[<name>.torch_axis]``).

The index is asked directly through its JSON API (scripts/index.py), not through pip's resolver, so pip's own
configuration (a constraint capping torch, say) does not hide a release. Pre-, dev- and yanked releases are never
proposed. The result is recorded in ``build/outdated.json`` (``record``), which ``make gate`` and ``make pr`` read
(``release_status``, ``release_sentence``, ``snapshot_sentence``); the last record stays until a new one replaces it.

Exit status: 0 when every pin is current; 3 (``NEWER``) when the index has something newer than what the kit uses
by default; 1 with one ``error:`` line when the index cannot be asked (offline, unreachable, no such project), and
then nothing is written; 130 after Ctrl-C. ``make`` reports a status other than 0 as its own ``Error 3`` (or 1).
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from scripts import KitError, index, plural, runlock, sources

NEWER = 3  # exit status when something on the index is newer than the kit's default
CONSTRAINTS = sources.KIT_ROOT / "requirements" / "constraints.txt"
RECORD = sources.KIT_ROOT / "build" / "outdated.json"


@dataclass(frozen=True)
class Watched:
    """One thing the kit pins that upstream releases: ``what`` (the kit's name: ``accelerate``, ``numpy``,
    ``torch``), its index ``package``, its ``kind`` (``upstream``, ``dependency``, ``torch``), ``default`` (the version
    the kit uses by default: the default pin, the lock's version, TORCH's; '' when TORCH pins none), ``known`` (the
    versions the kit holds: the pinned releases, the matrix's versions), ``owner`` (the upstream whose matrix holds a
    dependency) and ``spec`` (TORCH as given)."""

    what: str
    package: str
    kind: str
    default: str
    known: tuple[str, ...] = ()
    owner: str = ""
    spec: str = ""


def normalized(name: str) -> str:
    """A project name as PEP 503 compares them: lower case, runs of ``-``, ``_`` and ``.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_versions(text: str) -> dict[str, str]:
    """{normalized name: version} of the ``name==version`` lines of a pip constraints file."""
    found = re.findall(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", text, re.M)
    return {normalized(name): version for name, version in found}


def torch_version(spec: str) -> str:
    """The exact version of a torch requirement (``torch==2.13.0`` and ``torch==2.13.0+cpu``: ``2.13.0``), '' for
    one that pins none (``torch``, ``torch>=2.13``)."""
    found = re.fullmatch(r"\s*torch\s*===?\s*([0-9][^\s+;]*)(\+\S+)?\s*", spec)
    return found.group(1) if found else ""


def watched(table: dict, lock: dict[str, str], torch_spec: str) -> list[Watched]:
    """What ``make outdated`` checks, in the order it prints: every upstream of the pins file ``table`` (parsed
    upstream/sources.toml), then each one's dependency axis, then torch. ``lock``: ``lock_versions``."""
    found = [Watched(name, t.get("package", name), "upstream", t["version"], tuple(t.get("releases", {})))
             for name, t in table.items()]
    for name, t in table.items():
        axis = t.get("matrix")
        if axis:
            package = axis["package"]
            found.append(Watched(package, package, "dependency", lock.get(normalized(package), ""),
                                 tuple(axis.get("versions", [])), owner=name))
    axis = tuple(dict.fromkeys(v for t in table.values() for v in t.get("torch_axis", {}).get("versions", [])))
    return [*found, Watched("torch", "torch", "torch", torch_version(torch_spec), axis, spec=torch_spec)]


def key(version: str) -> tuple:
    """A sort key for any version the kit holds: a final release's ``index.final_key``, others first."""
    return index.final_key(version) or ((), -1)


def ranges(versions: list[str]) -> str:
    """The versions (oldest first) as words: all of them up to 4, else one ``first to last`` per minor series."""
    if len(versions) <= 4:
        return ", ".join(versions)
    series: dict[str, list[str]] = {}
    for version in versions:
        series.setdefault(".".join(version.split(".")[:2]), []).append(version)
    return ", ".join(v[0] if len(v) == 1 else f"{v[0]} to {v[-1]}" for v in series.values())


def judge(item: Watched, finals: list[index.Release]) -> dict:
    """One line of ``make outdated`` for ``item`` given the index's final releases of its package (oldest first):
    {"what", "package", "kind", "newest", "newest_date", "default", "known", "newer": [versions newer than the
    default], "status": "current" | "newer" | "unpinned", "text"}."""
    newest = finals[-1] if finals else None
    line = {"what": item.what, "package": item.package, "kind": item.kind, "default": item.default,
            "known": list(item.known), "newest": newest.version if newest else "",
            "newest_date": newest.date if newest else ""}
    if newest is None:
        return {**line, "newer": [], "status": "current", "text": "the index lists no final release"}
    newer = [r.version for r in finals if key(r.version) > key(item.default)] if item.default else []
    head = f"{newest.version} ({newest.date})"
    listed = ", ".join(sorted(item.known, key=key))
    known = {index.final_key(v) for v in item.known}
    if item.kind == "upstream":
        if not newer:
            text = f"{head} is the default pin; pinned: {listed}"
        elif index.final_key(newest.version) in known:
            text = (f"{head} is NEWER than the default pin {item.default}; it is pinned, not the default: "
                    f"`make pin {item.what.upper()}_VERSION={newest.version} DEFAULT=1`")
        else:
            text = (f"{head} is NEWER than the default pin {item.default} (pinned: {listed}): "
                    f"`make pin {item.what.upper()}_VERSION={newest.version}`")
    elif item.kind == "dependency":
        matrix = f"{item.owner}'s matrix ({listed})"
        absent = index.final_key(newest.version) not in known
        if not newer and not absent:
            text = f"{head} is the lock's and in {matrix}"
        elif not newer:
            text = f"{head} is the lock's but NEWER than {matrix}: add it to `versions` of [{item.owner}.matrix]"
        else:
            text = (f"{head} is NEWER than the lock's {item.default or '(none)'}" + (f" and {matrix}" if absent else
                    f" (in {matrix})") + f": {ranges(newer)}")
        newer = newer or ([newest.version] if absent else [])
    elif not item.default:
        return {**line, "newer": [], "status": "unpinned",
                "text": f"{head} is the newest; TORCH={item.spec} pins no exact version (pip chooses)"}
    else:
        rows = f" and the matrix's torch rows ({listed})" if item.known else ""
        beyond = [v for v in newer if all(key(v) > key(k) for k in item.known)]
        text = (f"{head} is the version of TORCH={item.spec}" if not newer else
                f"{head} is NEWER than TORCH={item.spec}{rows}: {ranges(beyond)}" if beyond else
                f"{head} is NEWER than TORCH={item.spec}, in the matrix's torch rows ({listed})")
    return {**line, "newer": newer, "status": "newer" if newer else "current", "text": text}


def record(lines: list[dict], found: dict[str, list[index.Release]], index_url: str, asked: datetime) -> dict:
    """The document of build/outdated.json: when and where the index was asked, per package its newest final
    release and the date of every final release ({"newest", "released": {version: date}}), and the lines."""
    packages = {package: {"newest": rels[-1].version if rels else "",
                          "released": {r.version: r.date for r in rels}} for package, rels in found.items()}
    return {"asked": asked.strftime("%Y-%m-%d %H:%M UTC"), "index": index_url,
            "status": "newer" if any(line["status"] == "newer" for line in lines) else "current",
            "packages": packages, "lines": lines}


def summary(doc: dict, out: str) -> str:
    """The last line of ``make outdated``: what is behind the index, or that nothing is."""
    behind = [f"{line['what']} {line['newest']}" for line in doc["lines"] if line["status"] == "newer"]
    where = f"{doc['index']}, {doc['asked']}; record in {out}"
    if not behind:
        return f"outdated: every pin is current ({len(doc['lines'])} checked on {where})"
    return (f"outdated: {len(behind)} of {len(doc['lines'])} behind the index: {', '.join(behind)} ({where}; exit "
            f"status {NEWER})")


# ---------------------------------------------------------------------------------------------------------------
# What make gate and make pr say about the last make outdated (pure functions of its record).


def load_record(path: Path = RECORD) -> dict | None:
    """The last ``make outdated`` record at ``path``, or None when there is none (or it cannot be read)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("packages"), dict) else None


def release_status(doc: dict | None, package: str, version: str) -> dict:
    """What the record ``doc`` says about release ``version`` of ``package``: {"asked", "index", "newest",
    "newest_date", "version", "version_date" ('' when not a release on record), "newer": bool}; {} when there is no
    record or it did not ask about ``package``."""
    entry = (doc or {}).get("packages", {}).get(package)
    if not entry or not entry.get("newest"):
        return {}
    released = entry.get("released", {})
    return {"asked": doc.get("asked", ""), "index": doc.get("index", ""), "newest": entry["newest"],
            "newest_date": released.get(entry["newest"], ""), "version": version,
            "version_date": released.get(version, ""), "newer": key(entry["newest"]) > key(version)}


def release_sentence(name: str, version: str, status: dict) -> str:
    """One sentence: whether ``name`` ``version`` (a base) is the newest release, as of the last ``make outdated``."""
    if not status:
        return (f"No `make outdated` is on record for {name}: whether it released after {version} is not known "
                "(run `make outdated`).")
    asked = f"the last `make outdated` ({status['asked']})"
    if status["newer"]:
        return (f"{name} {version} is not the newest release: {name} {status['newest']} "
                f"({status['newest_date']}) is newer, as of {asked}.")
    return f"{name} {version} is the newest release, as of {asked}."


def snapshot_sentence(name: str, version: str, status: dict, committed: str) -> str:
    """One clause: how old the default-branch snapshot (committed ``committed``, ``YYYY-MM-DD``) is relative to the
    newest release, and so what the series was last checked against; that this is unknown without a record."""
    if not status or not status.get("newest_date"):
        return ("how old that snapshot is relative to the newest release is not known (no `make outdated` on record "
                f"for {name})")
    days = (date.fromisoformat(status["newest_date"]) - date.fromisoformat(committed)).days
    newest = f"{name} {status['newest']} ({status['newest_date']})"
    if days <= 0:
        return f"that snapshot is {plural(-days, 'day')} newer than {newest}, the newest release"
    if not status["newer"]:
        return (f"that snapshot is {plural(days, 'day')} older than {newest}, this base and the newest release: the "
                "release is the newest upstream code the series was checked against")
    base_newer = status["version_date"] and status["version_date"] > committed
    last = f"this base, {name} {version} ({status['version_date']})" if base_newer else "that snapshot"
    return (f"that snapshot is {plural(days, 'day')} older than {newest}, the newest release, which the series was "
            f"not checked against; the newest upstream code it was checked against is {last}")


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring for the exit status)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.outdated", description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=index.DEFAULT_INDEX, help="the package index's JSON API (INDEX_JSON)")
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement (TORCH)")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--constraints", type=Path, default=CONSTRAINTS, help="the lock")
    parser.add_argument("--out", type=Path, default=RECORD, help="the record that make gate and make pr read")
    parser.add_argument("--timeout", type=float, default=index.TIMEOUT_S, help="seconds per request")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> int:
        try:
            try:
                lock = lock_versions(args.constraints.read_text())
            except OSError as e:
                raise KitError(f"cannot read the lock {args.constraints} ({e.strerror}): git checkout it") from None
            items = watched(sources.load(args.sources), lock, args.torch)
            asked = datetime.now(UTC)
            found = {}
            for item in items:  # every answer first: offline is one line, and nothing is written
                if item.package not in found:
                    found[item.package] = index.finals(index.ask(args.index, item.package, args.timeout))
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        lines = [judge(item, found[item.package]) for item in items]
        doc = record(lines, found, args.index, asked)
        width = max(len(line["what"]) for line in lines)
        for line in lines:
            print(f"{line['what']:<{width}}  {line['text']}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (args.out.parent / f"{args.out.name}.new").write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(args.out.parent / f"{args.out.name}.new", args.out)
        print(summary(doc, os.path.relpath(args.out)))
        return NEWER if doc["status"] == "newer" else 0

    return runlock.interruptible(work)


if __name__ == "__main__":
    sys.exit(main())
