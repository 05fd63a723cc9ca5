"""CI entry points run the README's commands: .ci/run and the GitHub Actions workflows (checked with actionlint); the
matrix workflow fans the rows out from the list the matrix prints."""

import re
import subprocess

from scripts.sources import KIT_ROOT

WORKFLOW = KIT_ROOT / ".github" / "workflows" / "gate.yml"
MATRIX_WORKFLOW = KIT_ROOT / ".github" / "workflows" / "matrix.yml"
ACTIONLINT = KIT_ROOT / ".tools" / "bin" / "actionlint"


def readme_commands() -> list[str]:
    """The commands of the README's set-up block (the first fenced block), without their shell comments."""
    block = re.search(r"```\n(.*?)```", (KIT_ROOT / "README.md").read_text(), re.S).group(1)
    return [command for line in block.splitlines() if (command := line.partition("#")[0].strip())]


def test_ci_run_calls_the_readme_commands_then_the_gate():
    lines = [line for line in (KIT_ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("make")]
    assert readme_commands() == ["make apply", "make test"]
    assert lines == [*readme_commands(), "make gate"]


def test_workflow_is_valid_and_runs_the_readme_commands_and_the_gate():
    result = subprocess.run([str(ACTIONLINT), str(WORKFLOW)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = WORKFLOW.read_text()
    runs = re.findall(r"^\s+run: (make \w+)", text, re.M)
    assert runs == [*readme_commands(), "make gate"]
    assert 'python-version: "3.11"' in text and "path: build/gate/" in text
    assert 'cat build/gate/report.md >> "$GITHUB_STEP_SUMMARY"' in text


def test_the_matrix_workflow_fans_out_the_rows_the_matrix_lists_and_collects_their_records(tmp_path):
    result = subprocess.run([str(ACTIONLINT), str(MATRIX_WORKFLOW)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = MATRIX_WORKFLOW.read_text()
    assert 'echo "rows=$(python -m scripts.matrix --list-rows)" >> "$GITHUB_OUTPUT"' in text
    assert "row: ${{ fromJSON(needs.rows.outputs.rows) }}" in text
    assert 'make matrix ROW="${{ matrix.row }}"' in text and "python -m scripts.matrix --collect" in text
    assert 'cat build/matrix/report.md >> "$GITHUB_STEP_SUMMARY"' in text
    broken = tmp_path / "broken.yml"  # actionlint checks what a schema cannot: a job's outputs that do not exist
    broken.write_text(text.replace("needs.rows.outputs.rows", "needs.rows.outputs.row_list"))
    result = subprocess.run([str(ACTIONLINT), str(broken)], capture_output=True, text=True)
    assert result.returncode != 0 and "row_list" in result.stdout, result.stdout
