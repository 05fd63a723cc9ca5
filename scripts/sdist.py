"""Download, verify, cache and safely extract an upstream's sdist.

Rules (README, "How checkouts are made"): download with
``pip download --no-deps --no-binary :all:``, check the sha256 before anything is extracted, extract with
tarfile's ``data`` filter (PEP 706: no absolute paths, no ``..``, no links out of the tree, no special files,
no owner or permission surprises), and keep the verified archive so a second run needs no network.
"""

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from scripts import KitError, last_line
from scripts.sources import Pin


def sha256_of(path: Path) -> str:
    """Return the lower-case hex sha256 of the file at ``path`` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(pin: Pin, cache_dir: Path, pip_options: list[str] = (), published_by: str = "") -> Path:
    """Return the path of ``pin``'s verified sdist in ``cache_dir``, downloading it with pip if needed.

    ``pip_options`` are extra ``pip download`` options (an index URL, ``--no-index --find-links DIR``).
    ``published_by``: where ``pin.sha256`` comes from when it is not upstream/sources.toml (``make pin``: the
    package index), for the message of a wrong hash.
    A cached archive is re-hashed on every call; one that differs from the pin is deleted and downloaded again
    (one line on stderr says so: the cache, not the pin, was bad). Raises KitError (one line, naming the file and
    the pin) when the download fails and nothing good is cached, or when the hash differs; a wrong archive is
    deleted.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached, damaged = cache_dir / pin.sdist, ""
    if cached.exists():
        damaged = sha256_of(cached)
        if damaged == pin.sha256:
            return cached
        cached.unlink()  # damaged or replaced: the pin may well be right, so the archive is downloaded again
    with tempfile.TemporaryDirectory(prefix="kit-download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                   "--dest", tmp, *pip_options, f"{pin.package}=={pin.version}"]
        result = subprocess.run(command, capture_output=True, text=True)
        downloaded = Path(tmp) / pin.sdist
        if result.returncode != 0 or not downloaded.exists():
            reason = last_line(result.stderr) or f"pip saved no file named {pin.sdist}"
            where = (f"the copy in {cache_dir} had sha256 {damaged} and was deleted" if damaged
                     else f"it is not in {cache_dir}")
            raise KitError(f"cannot download {pin.sdist} ({pin.package}=={pin.version}, sha256 {pin.sha256}) and "
                           f"{where}: check the network or pip's index options, or put the file there ({reason})")
        _verify(downloaded, pin, published_by)
        shutil.move(downloaded, cached)
    if damaged:
        print(f"{pin.name} {pin.version}: the cached {cached.name} had sha256 {damaged}, not the pinned one: it was "
              "deleted and downloaded again", file=sys.stderr, flush=True)
    return cached


def check_cached(pin: Pin, cache_dir: Path, pip_options: list[str] = ()) -> str:
    """Re-hash ``pin``'s sdist in ``cache_dir``, if one is there, and replace a damaged one at once (``fetch``), so
    that the next checkout made from it needs no network (issue 33: a truncated archive passed every ``make apply``
    until a checkout had to be rebuilt). Returns a warning line when the damaged archive could not be downloaded
    again (it is deleted then; nothing else depends on it while the checkout's base exists), else ''."""
    cached = cache_dir / pin.sdist
    if not cached.exists() or sha256_of(cached) == pin.sha256:
        return ""
    try:
        fetch(pin, cache_dir, pip_options)
    except KitError as e:
        return f"warning: {e}; the checkout's base/{pin.version} is unaffected"
    return ""


def _verify(archive: Path, pin: Pin, published_by: str = "") -> None:
    actual = sha256_of(archive)
    if actual == pin.sha256:
        return
    archive.unlink()
    if published_by:
        raise KitError(f"{archive.name} as pip downloaded it has sha256 {actual}, but {published_by} publishes "
                       f"{pin.sha256} for {pin.name} {pin.version}: the archive was deleted and nothing was pinned; "
                       "check where pip downloads from (PIP_OPTS) and run again")
    raise KitError(f"{archive.name} has sha256 {actual}, but upstream/sources.toml pins {pin.sha256} for "
                   f"{pin.name} {pin.version}: the archive was deleted; check the pin and run again")


def _data_filter_no_absolute(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, except that an absolute member name is refused instead of made relative."""
    if member.name.startswith("/"):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, dest)


def extract(archive: Path, dest: Path) -> Path:
    """Extract the sdist ``archive`` (.tar.gz) into the new directory ``dest`` and return its top directory.

    An sdist holds one top directory (``name-version/``). Raises KitError, removing ``dest`` again, when a
    member is unsafe (absolute path, ``..``, a link out of the tree, a device) or the archive does not hold
    exactly one top directory.
    """
    dest.mkdir(parents=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter=_data_filter_no_absolute)
        tops = list(dest.iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise KitError(f"{archive.name} does not hold exactly one top directory: refusing it")
        return tops[0]
    except tarfile.FilterError as e:
        shutil.rmtree(dest)
        raise KitError(f"{archive.name} holds an unsafe member ({e}): refusing to extract it") from None
    except (tarfile.TarError, OSError) as e:
        shutil.rmtree(dest)
        raise KitError(f"{archive.name} cannot be extracted ({e}): delete it from the cache and run again") from None
    except KitError:
        shutil.rmtree(dest)
        raise
