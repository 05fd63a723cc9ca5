"""Command line of the checkout workflow: ``python -m scripts.upstream COMMAND`` (the Makefile calls it).

Commands (each acts on every upstream in ``upstream/sources.toml``, or on ``--only NAME``):
  checkout  make ``upstream/<name>/`` with the pristine commit ``base/<version>`` (sdist: download, verify,
            cache; or ``--source git``: the upstream's tag); a cached sdist is re-hashed on every run and a damaged one
            downloaded again at once
  apply     checkout, then ``base/<version>`` + ``patches/<name>/*.patch`` on branch ``series/<version>``
            (``--keep-conflict``: a patch that does not apply leaves ``git am`` stopped there, for the user)
  unapply   back to ``base/<version>`` (refuses to drop uncommitted edits or unexported commits)
  export    ``patches/<name>/`` regenerated from ``base/<version>..HEAD`` with ``git format-patch``
            (``--resign``: first re-signed with your git identity)
  install   editable installs of the checkouts into the running Python (skipped when already in place)

Every command checks all the selected upstreams before it changes any (all or nothing; an error says which
were changed when one fails half-way). Exit status 0 on success; 1 with one line ``error: ...`` on stderr when
something needs the user; 130 after Ctrl-C, SIGTERM or SIGHUP (one line: where the checkouts are).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from scripts import ArgumentParser, KitError, checkout, runlock, sdist, series, sources, worktree
from scripts.git import git


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (without the program name) into the options described in the module docstring."""
    parser = ArgumentParser(prog="python -m scripts.upstream", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["checkout", "apply", "unapply", "export", "install"])
    parser.add_argument("--only", help="act on this upstream only")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION",
                        help="pin another version of an upstream (default: `version` in sources.toml)")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE, help="the pins file")
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream", help="checkouts live here")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches", help="series live here")
    parser.add_argument("--cache", type=Path, default=sources.KIT_ROOT / "upstream" / ".sdist",
                        help="verified sdists are kept here")
    parser.add_argument("--pip-options", default="", help="extra pip options, one shell-quoted string")
    parser.add_argument("--discard", action="store_true", help="unapply: drop commits that are not exported")
    parser.add_argument("--keep-conflict", action="store_true",
                        help="apply: a patch that does not apply leaves git am stopped there for you to resolve")
    parser.add_argument("--resign", action="store_true",
                        help="export: first make you (git's user.name/email) author and sole Signed-off-by")
    parser.add_argument("--check-only", action="store_true",
                        help="only the checks of the command on the checkouts that exist (make apply runs them "
                             "before it builds the venv); nothing is downloaded or changed")
    parser.add_argument("--source", choices=["sdist", "git"], default="sdist",
                        help="where a missing base comes from: the pinned sdist, or the upstream's git tag")
    return parser.parse_args(argv)


def install(pin: sources.Pin, repo: Path, table: dict, pip_options: list[str]) -> str:
    """``pip install -e repo`` into the running Python unless ``pin.package`` is installed from it at ``pin.version``.

    ``table`` is the upstream's table of sources.toml: ``install_options`` (list of pip options) and
    ``install_env`` (environment, e.g. DeepSpeed's ``DS_BUILD_OPS=0``) and ``install_restores`` (files the
    install rewrites, checked out again afterwards so the checkout stays clean). Raises KitError with pip's
    last line.
    """
    try:
        dist = metadata.distribution(pin.package)
        url = json.loads(dist.read_text("direct_url.json") or "{}")
        same_version = dist.version.split("+")[0] == pin.version
        if same_version and url.get("dir_info", {}).get("editable") and url.get("url") == repo.resolve().as_uri():
            return f"{pin.name}: already installed editable from {repo}"
    except metadata.PackageNotFoundError:
        pass
    command = [sys.executable, "-m", "pip", "install", "--quiet", *table.get("install_options", []),
               *pip_options, "--editable", str(repo)]
    env = {**os.environ, **table.get("install_env", {})}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.lower().startswith("error:")] or lines[-1:] or ["no message"]
        raise KitError(f"pip could not install {repo} ({errors[0]}): run `{shlex.join(command)}` to see why")
    for path in table.get("install_restores", []):
        git(repo, "checkout", "--quiet", "--", path)
    return f"{pin.name}: installed editable from {repo}"


def compile_bytecode(pin: sources.Pin, repo: Path) -> None:
    """Write the bytecode of the checkout's package (``__pycache__``, ignored in the checkout), checked by the
    source's hash, not its time stamp: a file that a later ``make apply`` rewrites within the same second and to the
    same size is never served from stale bytecode. Where ``PYTHONDONTWRITEBYTECODE`` is set, nothing else writes it,
    and every process that imports the upstream (each rank and forkserver of a launch) would compile DeepSpeed anew:
    about 1 s of CPU per import (issue 23). compileall cannot tell a hash-checked file up to date, so every file is
    compiled each time (about 1.5 s for both checkouts). Raises KitError when it fails."""
    package = pin.package.replace("-", "_")
    target = worktree.package_dir(repo, package) / package
    command = [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", str(target)]
    result = subprocess.run(command, capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    if result.returncode != 0:
        raise KitError(f"could not compile {target} ({(result.stdout + result.stderr).strip()[-300:]}): run "
                       f"`{shlex.join(command)}` to see why")


def run(args: argparse.Namespace) -> list[str]:
    """Carry out ``args.command`` for each selected upstream, all or nothing; print and return one line per step.

    First every upstream is checked (``series.check_*``: nothing is changed while one of them would refuse), then
    each is changed in turn. A KitError during the changes names the upstreams already changed (their lines are
    printed above it). ``checkout`` and the making of missing bases only add tags and commits, so they run first.
    """
    pip_options = shlex.split(args.pip_options)
    chosen = sources.versions(args.version)
    names = [args.only] if args.only else sources.names(args.sources)
    pins = {name: sources.pin(name, chosen.get(name), args.sources) for name in names}
    lines = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if args.check_only:  # a checkout or base still to make holds nothing of the user's
        pins = {name: pin for name, pin in pins.items() if series.has_base(args.checkouts / name, pin.version)}
    for name, pin in pins.items():
        repo, patch_dir = args.checkouts / name, args.patches / name
        if args.check_only:
            continue
        if args.command in ("checkout", "apply"):
            base = checkout.make_base(pin, repo, args.cache, pip_options, args.source)
            say(f"{name}: base/{pin.version} is {base[:12]}")
            warning = sdist.check_cached(pin, args.cache, pip_options)
            if warning:
                print(warning, file=sys.stderr, flush=True)
        elif not (repo / ".git").is_dir():
            raise KitError(f"{repo} does not exist yet: run `make apply` first")
    try:
        for name, pin in pins.items():
            repo, patch_dir = args.checkouts / name, args.patches / name
            if args.command == "apply":
                series.check_apply(repo, pin.version, patch_dir, args.keep_conflict)
            elif args.command == "unapply":
                series.check_unapply(repo, pin.version, patch_dir, args.discard)
            elif args.command == "export":
                series.check_export(repo, pin.version)
    except KitError as e:
        raise KitError(f"{e}; nothing was changed") from None
    if args.check_only:
        return lines
    done = []
    try:
        for name, pin in pins.items():
            repo, patch_dir = args.checkouts / name, args.patches / name
            if args.command == "apply":
                say(series.apply(repo, pin.version, patch_dir, args.keep_conflict))
            elif args.command == "unapply":
                say(series.unapply(repo, pin.version, patch_dir, args.discard))
            elif args.command == "export":
                if args.resign:
                    say(f"{name}: re-signed as {series.resign(repo, pin.version)}")
                say(series.export(repo, pin.version, patch_dir))
            elif args.command == "install":
                say(install(pin, repo, sources.load(args.sources)[name], pip_options))
                compile_bytecode(pin, repo)
            done.append(name)
    except series.KeptConflict as e:  # it says where git am stopped
        raise KitError(f"{e}" + (f" ({', '.join(done)} changed as shown above)" if done else "")) from None
    except KitError as e:
        changed = f"{', '.join(done)} changed as shown above" if done else "no checkout changed"
        raise KitError(f"{e} ({changed})") from None
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the command, printing its summary lines; on KitError print ``error: ...``, return 1.

    Ctrl-C, SIGTERM and SIGHUP stop it without a traceback (``runlock.interruptible``): exit status 130.
    """

    args = parse_args(sys.argv[1:] if argv is None else argv)

    def work() -> int:
        try:
            run(args)
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0

    return runlock.interruptible(work, lambda: runlock.describe_checkouts(args.checkouts, args.patches, args.sources))

if __name__ == "__main__":
    sys.exit(main())
