"""The locked environment: ``requirements/constraints.txt`` and ``make lock``, which regenerates it.

``constraints.txt`` holds every package of a working venv at an exact version (``name==version``, one a line), torch
excepted (the Makefile's ``TORCH`` chooses it) and pip (the installer the venv comes with). ``make apply`` and the
matrix venvs (scripts/matrix.py) install with it as pip constraints (``-c``), so a new release of an unrelated
package cannot change the gate's verdict.

``python -m scripts.lock`` (``make lock``) makes a fresh venv ``build/lock/venv`` the way ``make apply`` makes
``.venv``: ``TORCH``, then ``requirements/kit.txt``, then each upstream at its default pin with its runtime
dependencies (its verified sdist, built with the options of ``upstream/sources.toml``), all resolved afresh with
no constraints; checks it with ``pip check``; and writes ``pip freeze`` of it, less torch, pip and the upstreams
themselves, to ``requirements/constraints.txt``. Exit status 0, or 1 with one line ``error: ...``.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from scripts import KitError, last_line, sdist, sources

CONSTRAINTS = sources.KIT_ROOT / "requirements" / "constraints.txt"
KIT_REQUIREMENTS = sources.KIT_ROOT / "requirements" / "kit.txt"
# Never locked: torch (TORCH chooses it) and pip (comes with the venv).
UNLOCKED = ("torch", "pip")


def canonical(name: str) -> str:
    """A distribution name in PEP 503 normal form (``PyYAML`` -> ``pyyaml``, ``typing_extensions`` ->
    ``typing-extensions``), as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read(path: Path = CONSTRAINTS) -> dict[str, str]:
    """Return {canonical name: version} of the ``name==version`` lines of ``path`` (comments and blanks skipped).

    Raises KitError when the file is missing or a line is not ``name==version``.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise KitError(f"{path} is missing: run `make lock` or restore it from git") from None
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise KitError(f"{path}:{number}: '{line}' is not name==version: run `make lock` to regenerate the file")
        pins[canonical(name.strip())] = version.strip()
    return pins


def installed() -> dict[str, str]:
    """Return {canonical name: version} of the distributions of the running Python that are not editable installs
    (editable ones are the checkouts under ``upstream/``)."""
    found = {}
    for dist in metadata.distributions():
        if json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable"):
            continue
        found[canonical(dist.metadata["Name"])] = dist.version
    return found


def free_of_lock() -> set[str]:
    """Names a venv may hold beyond the lock: UNLOCKED and the packages torch itself requires (a CUDA build of
    ``TORCH`` brings ``nvidia-*`` and ``triton``, which its exact pins choose)."""
    try:
        torch_requires = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        torch_requires = []
    return set(UNLOCKED) | {canonical(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]) for req in torch_requires}


def drift(locked: dict[str, str], have: dict[str, str], free: set[str]) -> list[str]:
    """Return one line per difference between the lock and a venv: a locked package missing or at another version,
    a package the lock does not know (names in ``free`` excepted, and versions compared without a local label such
    as ``+cpu``)."""
    problems = []
    for name, version in sorted(locked.items()):
        if name not in have:
            problems.append(f"{name}: locked at {version}, not installed")
        elif have[name].split("+")[0] != version.split("+")[0]:
            problems.append(f"{name}: locked at {version}, installed {have[name]}")
    problems += [f"{name}: installed {version}, not in the lock" for name, version in sorted(have.items())
                 if name not in locked and name not in free]
    return problems


def pip(python: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m pip args`` (output captured); raise KitError with pip's first ``ERROR:`` line on failure."""
    result = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                            env={**os.environ, **(env or {})})
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if line.startswith("ERROR")]
        reason = errors[0] if errors else last_line(result.stderr + result.stdout)
        raise KitError(f"pip {args[0]} failed in {python.parent.parent} ({reason}): run "
                       f"`{shlex.join([str(python), '-m', 'pip', *args])}` to see why")
    return result


def make_lock(venv: Path, torch: str, pip_options: list[str], python: str, cache: Path) -> str:
    """Make the fresh venv ``venv`` (removed first) as described in the module docstring and return the text of
    the constraints file. Raises KitError from pip (install, ``pip check``) or sdist.fetch."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip(py, "install", "--quiet", *pip_options, torch)
    pip(py, "install", "--quiet", *pip_options, "-r", str(KIT_REQUIREMENTS))
    table, packages = sources.load(), []
    for name, entry in table.items():
        pin = sources.pin(name)
        archive = sdist.fetch(pin, cache, pip_options)
        pip(py, "install", "--quiet", *entry.get("install_options", []), *pip_options, str(archive),
            env=entry.get("install_env", {}))
        packages.append(pin.package)
    pip(py, "check")
    excludes = [option for name in (*UNLOCKED, *packages) for option in ("--exclude", name)]
    frozen = pip(py, "freeze", "--all", "--exclude-editable", *excludes).stdout
    version = subprocess.run([str(py), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    pins = ", ".join(f"{package} {sources.pin(name).version}" for package, name in zip(packages, table, strict=True))
    header = (f"# Generated by `make lock` (python -m scripts.lock): pip freeze of a fresh venv with Python "
              f"{version},\n# {torch}, requirements/kit.txt and {pins} with their dependencies; `pip check` clean.\n"
              f"# torch and pip are not locked (TORCH chooses torch).\n")
    return header + frozen


def main(argv: list[str] | None = None) -> int:
    """Regenerate the constraints file (``--out``); print where it went and how many packages it pins."""
    parser = argparse.ArgumentParser(prog="python -m scripts.lock", description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement (the Makefile's TORCH)")
    parser.add_argument("--pip-options", default="", help="extra pip options, one shell-quoted string")
    parser.add_argument("--python", default=sys.executable, help="the Python 3.11 that makes the venv")
    parser.add_argument("--venv", type=Path, default=sources.KIT_ROOT / "build" / "lock" / "venv")
    parser.add_argument("--cache", type=Path, default=sources.KIT_ROOT / "upstream" / ".sdist")
    parser.add_argument("--out", type=Path, default=CONSTRAINTS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = make_lock(args.venv, args.torch, shlex.split(args.pip_options), args.python, args.cache)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.write_text(text)
    print(f"lock: {len(read(args.out))} packages pinned in {args.out} (venv {args.venv})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
