"""``make pin <NAME>_VERSION=X``: add release X of an upstream to ``upstream/sources.toml`` with a checked sha256.

``python -m scripts.pin --version NAME=X [--default] [--index URL] [--pip-options OPTS] [--sources FILE]``

The sdist's file name and sha256 come from the package index's JSON API (scripts/index.py: the release's
``.tar.gz`` sdist and its ``digests.sha256``); the archive is then downloaded with pip and checked against that hash
(scripts/sdist.fetch: a file that differs is deleted, nothing is pinned) and kept in ``upstream/.sdist/``, so the
next ``make apply NAME_VERSION=X`` needs no network for it. Only then the table ``[<name>.releases."X"]`` is written
into the file's text, among the upstream's other releases in version order (newest first, as the file keeps them);
every other line, comment and table stays as it was, which is checked by parsing the result before it replaces the
file. The default pin (``version``) changes only with ``--default`` (``make pin ... DEFAULT=1``): a new release is
first checked (``make apply`` / ``make gate`` with ``NAME_VERSION=X``), and the series moves to it in a commit of its
own. A release that is pinned already with the index's hash is left as it is; one pinned with another hash is
refused. Exit status 0, or 1 with one ``error:`` line (nothing changed), 130 after Ctrl-C.
"""

import argparse
import os
import re
import shlex
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from scripts import KitError, index, runlock, sdist, sources

HEADER = re.compile(r'^\[{1,2}\s*([A-Za-z0-9_-]+)\s*(?:\.\s*releases\s*\.\s*"([^"]+)")?[^\n]*$')


def release_of(doc: dict, package: str, version: str) -> index.Release:
    """The release ``version`` of the project JSON ``doc``; raise KitError when the index does not list it (naming
    its newest final releases), or lists it only yanked or without a ``.tar.gz`` sdist."""
    found = index.releases(doc).get(version)
    if found is None or not found.files:
        newest = ", ".join(r.version for r in index.finals(doc)[-3:]) or "none"
        raise KitError(f"the package index lists no release {package} {version} (its newest: {newest}): check the "
                       "version")
    if found.yanked:
        raise KitError(f"{package} {version} is yanked on the package index: pin another release")
    if found.sdist() is None or not re.fullmatch(r"[0-9a-f]{64}", found.sdist().sha256.lower()):
        raise KitError(f"the package index has no .tar.gz sdist with a sha256 for {package} {version}: the kit "
                       "builds its checkouts from sdists")
    return found


def _headers(lines: list[str]) -> list[tuple[int, str, str]]:
    """(line number, upstream, release version or '') of every table header of the file's lines."""
    found = []
    for number, line in enumerate(lines):
        match = HEADER.match(line)
        if match:
            found.append((number, match.group(1), match.group(2) or ""))
    return found


def _block_end(lines: list[str], headers: list[tuple[int, str, str]], start: int) -> int:
    """The line number after the table that starts at line ``start``: before the next header and the comments and
    blank lines just above it (they belong to that table), or the end of the file."""
    following = [n for n, _, _ in headers if n > start]
    end = following[0] if following else len(lines)
    while following and end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return end


def add_release(text: str, name: str, version: str, sdist_name: str, sha256: str, comment: str) -> str:
    """``text`` (upstream/sources.toml) with the table ``[<name>.releases."<version>"]`` (``sdist``, ``sha256`` and
    ``comment`` after its header) inserted before the upstream's first release that is older, else after its last
    table; nothing else changes. Raises KitError when the file has no table ``[<name>]``."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    headers = _headers(lines)
    mine = [(n, v) for n, owner, v in headers if owner == name]
    if not mine:
        raise KitError(f"upstream/sources.toml has no table [{name}]: add the upstream first")
    block = [f'[{name}.releases."{version}"]  # {comment}\n', f'sdist = "{sdist_name}"\n', f'sha256 = "{sha256}"\n']
    older = [n for n, v in mine if v and index.final_key(v) and index.final_key(version)
             and index.final_key(v) < index.final_key(version)]
    if older:
        at = older[0]
        while at > 0 and lines[at - 1].lstrip().startswith("#"):
            at -= 1  # the comments right above a table are that table's
        return "".join(lines[:at] + block + ["\n"] + lines[at:])
    end = _block_end(lines, headers, mine[-1][0])
    while end > mine[-1][0] + 1 and not lines[end - 1].strip():
        end -= 1  # the new table follows the last one after one blank line, whatever blank lines came next
    return "".join(lines[:end] + ["\n"] + block + lines[end:])


def set_default(text: str, name: str, version: str) -> str:
    """``text`` with the ``version = "..."`` line of the table ``[<name>]`` set to ``version`` (its comment kept);
    raise KitError when the table has no such line."""
    lines = text.splitlines(keepends=True)
    headers = _headers(lines)
    start = next((n for n, owner, v in headers if owner == name and lines[n].strip().startswith(f"[{name}]")), None)
    if start is not None:
        following = [n for n, _, _ in headers if n > start]
        for number in range(start + 1, following[0] if following else len(lines)):
            found = re.match(r'^(\s*version\s*=\s*)"[^"]*"', lines[number])
            if found:
                lines[number] = f'{found.group(1)}"{version}"' + lines[number][found.end():]
                return "".join(lines)
    raise KitError(f"upstream/sources.toml has no `version = \"...\"` line in [{name}]: set the default by hand")


def checked(old: str, new: str, name: str, version: str, default: bool) -> None:
    """Raise KitError unless ``new`` parses and differs from ``old`` exactly by the release (and the default)."""
    before, after = tomllib.loads(old), tomllib.loads(new)
    release = after.get(name, {}).get("releases", {}).pop(version, None)
    before.get(name, {}).get("releases", {}).pop(version, None)
    if default:
        before[name]["version"] = after[name]["version"]
    if release is None or before != after or (default and after[name]["version"] != version):
        raise KitError("the edit of upstream/sources.toml would change more than the new release: nothing was "
                       "written; add the table by hand")


def pin(name: str, version: str, default: bool, path: Path, index_url: str, cache: Path,
        pip_options: list[str]) -> str:
    """Pin ``name`` ``version`` in the file at ``path`` (see the module docstring); return the summary line."""
    text = path.read_text()
    table = sources.load(path).get(name)
    if table is None:
        raise KitError(f"no upstream '{name}' in {path} (there: {', '.join(sources.names(path))})")
    package = table.get("package", name)
    found = release_of(index.ask(index_url, package), package, version)
    file = found.sdist()
    sha256 = file.sha256.lower()
    pinned = table.get("releases", {}).get(version)
    if pinned and (pinned.get("sdist"), pinned.get("sha256", "").lower()) != (file.filename, sha256):
        raise KitError(f"{name} {version} is pinned in {path} as {pinned.get('sdist')} with sha256 "
                       f"{pinned.get('sha256')}, but the package index publishes {file.filename} with sha256 "
                       f"{sha256}: find out which is right, and fix the file by hand")
    archive = sdist.fetch(sources.Pin(name, package, version, file.filename, sha256, "", "", ()), cache,
                          pip_options, published_by="the package index")
    new = text
    if not pinned:
        day = datetime.now(UTC).strftime("%Y-%m-%d")
        comment = f"released {found.date}; sha256 of the package index, matched by the download on {day}"
        new = add_release(new, name, version, file.filename, sha256, comment)
    if default and table["version"] != version:
        new = set_default(new, name, version)
    if new == text:
        return f"pin: {name} {version} is already pinned ({file.filename}, sha256 {sha256}); nothing changed"
    checked(text, new, name, version, default)
    (path.parent / f"{path.name}.new").write_text(new)
    os.replace(path.parent / f"{path.name}.new", path)
    done = "pinned" if not pinned else "already pinned"
    after = (f"the default is now {version}" if default else
             f"the default stays {table['version']} (DEFAULT=1 makes {version} the default)")
    return (f"pin: {name} {version} {done} in {os.path.relpath(path)} ({file.filename}, sha256 {sha256}, the "
            f"index's, matching the download in {os.path.relpath(archive.parent)}); {after}; next: `make apply "
            f"{name.upper()}_VERSION={version}`")


def main(argv: list[str] | None = None) -> int:
    """Entry point: exactly one non-empty ``--version NAME=X``; exit 0, 1 with one ``error:`` line, 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m scripts.pin", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION")
    parser.add_argument("--default", action="store_true", help="also make it the upstream's default `version`")
    parser.add_argument("--index", default=index.DEFAULT_INDEX, help="the package index's JSON API (INDEX_JSON)")
    parser.add_argument("--pip-options", default="", help="extra pip download options, one shell-quoted string")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--cache", type=Path, default=sources.KIT_ROOT / "upstream" / ".sdist")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> int:
        try:
            chosen = sources.versions(args.version)
            if len(chosen) != 1:
                raise KitError("make pin takes the version of one upstream, e.g. `make pin ACCELERATE_VERSION=1.16.0`")
            (name, version), = chosen.items()
            print(pin(name, version, args.default, args.sources, args.index, args.cache,
                      shlex.split(args.pip_options)))
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0

    return runlock.interruptible(work)


if __name__ == "__main__":
    sys.exit(main())
