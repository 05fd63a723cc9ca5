"""The version matrix: every pinned release of every upstream, series applied and gated.

For each upstream and each release in its ``releases`` table (upstream/sources.toml): ``make apply`` for that
version (checkout, ``git am --3way``, editable install), then the gate for that upstream alone, its report in
``build/matrix/<name>-<version>/``. Writes ``build/matrix/report.{json,md}``: version x applies cleanly x gate
verdict (with FAIL_TO_PASS / PASS_TO_PASS counts); where the series does not apply, whether its hunks outside the
test paths (the fix itself) still do. The checkouts are put back on their default versions at the
end. Exit status 0 when every release applies and passes the gate.
"""

import json
import subprocess
import sys
import time

from scripts import series, sources

OUT = sources.KIT_ROOT / "build" / "matrix"


def upstream(command: str, name: str, version: str) -> subprocess.CompletedProcess:
    """Run ``python -m scripts.upstream COMMAND --only NAME --version NAME=VERSION``; output captured."""
    return subprocess.run([sys.executable, "-m", "scripts.upstream", command, "--only", name, "--version",
                           f"{name}={version}"], cwd=sources.KIT_ROOT, capture_output=True, text=True)


def fix_hunks_apply(name: str, version: str, entry: dict) -> bool:
    """True when the series' hunks outside the test paths apply to ``base/<version>`` (checked, not applied)."""
    repo, base = sources.KIT_ROOT / "upstream" / name, f"base/{version}"
    excludes = [f"--exclude={path.rstrip('/')}/*" for path in entry.get("test_paths", ["tests/"])]
    patches = series.patch_files(sources.KIT_ROOT / "patches" / name)
    return series.first_failing(repo, base, patches, *excludes) is None


def main() -> int:
    """Run the matrix; print and write the table; return 0 when every cell passes."""
    table = sources.load()
    rows = []
    for name, entry in table.items():
        for version in sorted(entry["releases"], key=lambda v: tuple(map(int, v.split(".")))):
            started = time.monotonic()
            applied = upstream("apply", name, version)
            row = {"upstream": name, "version": version, "applies": applied.returncode == 0,
                   "apply_message": (applied.stdout + applied.stderr).strip().splitlines()[-1:], "gate": "not run",
                   "fix_hunks_apply": applied.returncode == 0 or fix_hunks_apply(name, version, entry)}
            if row["applies"] and upstream("install", name, version).returncode == 0:
                out = OUT / f"{name}-{version}"
                gate = [sys.executable, "-m", "scripts.gate", "--only", name, "--version", f"{name}={version}",
                        f"--out={out}"]
                subprocess.run(gate, cwd=sources.KIT_ROOT, stdout=subprocess.DEVNULL)
                report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
                result = report.get("upstreams", {}).get(name, {})
                row |= {"gate": report.get("verdict", "no report"), "violations": result.get("violations", []),
                        "FAIL_TO_PASS": len(result.get("FAIL_TO_PASS", [])),
                        "PASS_TO_PASS": len(result.get("PASS_TO_PASS", []))}
            row["wall_s"] = round(time.monotonic() - started, 1)
            rows.append(row)
            print(f"matrix {name} {version}: applies {row['applies']}, gate {row['gate']} ({row['wall_s']} s)",
                  flush=True)
        upstream("apply", name, entry["version"])
        upstream("install", name, entry["version"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(rows, indent=2) + "\n")
    md = ["| upstream | version | series applies cleanly | fix hunks apply | gate | FAIL_TO_PASS | PASS_TO_PASS "
          "| wall (s) |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['upstream']} | {r['version']} | {'yes' if r['applies'] else 'no'} | "
           f"{'yes' if r['fix_hunks_apply'] else 'no'} | {r['gate']} | {r.get('FAIL_TO_PASS', '-')} | "
           f"{r.get('PASS_TO_PASS', '-')} | {r['wall_s']} |" for r in rows]
    md += [""] + [f"- {r['upstream']} {r['version']}: {r['apply_message'][0]}" for r in rows if not r["applies"]]
    (OUT / "report.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r["applies"] and r["gate"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
