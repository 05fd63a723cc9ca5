"""Ask a package index's JSON API what a project has released (``make outdated``, ``make pin``).

The API is PyPI's (Warehouse's) project JSON, ``<index>/<project>/json``: ``releases`` maps every version to its
files, each with ``filename``, ``packagetype`` (``sdist``, ``bdist_wheel``), ``digests.sha256``,
``upload_time_iso_8601`` and ``yanked``. The per-version endpoint ``<index>/<project>/<version>/json`` is not used:
the mirror this kit is built on answers it with 404 (2026-12-03), and the project JSON holds the same files.
Only the standard library is used (``urllib``); pip keeps doing the downloads.
"""

import http.client
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from scripts import KitError

DEFAULT_INDEX = "https://pypi.org/pypi"
TIMEOUT_S = 30.0  # per request
# A final release in PEP 440 terms: release segments and an optional post-release (no pre-, dev- or local part).
FINAL = re.compile(r"(\d+(?:\.\d+)*)(?:\.post(\d+))?")


@dataclass(frozen=True)
class File:
    """One file of a release: its name, its kind (``sdist``, ``bdist_wheel``), its lower-case hex sha256."""

    filename: str
    packagetype: str
    sha256: str


@dataclass(frozen=True)
class Release:
    """One release of a project: its version, the date of its first upload (``YYYY-MM-DD``, UTC; '' when it has no
    file), whether every file of it is yanked, and its files."""

    version: str
    date: str
    yanked: bool
    files: tuple[File, ...]

    def sdist(self) -> File | None:
        """The release's ``.tar.gz`` sdist (the kit extracts only those), or None."""
        return next((f for f in self.files if f.packagetype == "sdist" and f.filename.endswith(".tar.gz")), None)


def final_key(version: str) -> tuple | None:
    """Sort key of a final release (``2.14.1`` before ``2.15.0``, ``1.0`` equal to ``1.0.0``), None for a pre-, dev-
    or local version, which ``make outdated`` never proposes."""
    found = FINAL.fullmatch(version)
    if not found:
        return None
    parts = [int(part) for part in found.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts), int(found.group(2) or 0)


def ask(index: str, project: str, timeout: float = TIMEOUT_S) -> dict:
    """The parsed project JSON of ``project`` from ``index`` (``https://pypi.org/pypi``, or a local ``http://`` or
    ``file://`` directory laid out the same way).

    Raises KitError, one line, when the index cannot be reached (offline, refused, timed out, TLS), has no such
    project (HTTP 404), or answers with something that is not a project's JSON.
    """
    url = f"{index.rstrip('/')}/{project}/json"
    if not re.match(r"^(https?|file)://", index):
        raise KitError(f"INDEX_JSON={index} is not an http(s):// or file:// URL: use e.g. {DEFAULT_INDEX}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            doc = json.loads(response.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise KitError(f"the package index {index} has no project {project} ({url}: HTTP 404): check the name "
                           "in upstream/sources.toml and the index (INDEX_JSON)") from None
        raise KitError(f"the package index {index} answered {url} with HTTP {e.code} ({e.reason}): try again "
                       "later, or set INDEX_JSON") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise KitError(f"cannot reach the package index {index} (offline or unreachable: {reason}): check the "
                       "network or INDEX_JSON; nothing was changed") from None
    except ValueError as e:
        raise KitError(f"the package index {index} answered {url} with something that is not JSON ({e}): check "
                       "INDEX_JSON (it takes a JSON API such as https://pypi.org/pypi)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("releases"), dict):
        raise KitError(f"{url} holds no `releases`: INDEX_JSON must be a JSON API such as https://pypi.org/pypi")
    return doc


def releases(doc: dict) -> dict[str, Release]:
    """{version: Release} of a project JSON (see ``ask``), every version the index lists, in the index's order."""
    found = {}
    for version, files in doc["releases"].items():
        kept = tuple(File(f.get("filename", ""), f.get("packagetype", ""), f.get("digests", {}).get("sha256", ""))
                     for f in files)
        dates = sorted(f.get("upload_time_iso_8601") or f.get("upload_time") or "" for f in files)
        found[version] = Release(version, dates[0][:10] if dates else "", bool(files) and all(
            f.get("yanked") for f in files), kept)
    return found


def finals(doc: dict) -> list[Release]:
    """The final releases of a project JSON that have a file and are not yanked, oldest first."""
    kept = [r for r in releases(doc).values() if final_key(r.version) and r.files and not r.yanked]
    return sorted(kept, key=lambda r: final_key(r.version))
