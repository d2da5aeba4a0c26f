"""The fault matrix's report: ``python -m ml_assets_tests.faults.report FILE`` reads the JSON lines
test_matrix.py wrote (one per cell) and prints a table of what happened in each cell, then a line
``RESULT fault_matrix_cells_whole N goal == M``: cells where every promise held, of all cells run."""

import json
import sys
from pathlib import Path


def held(cell: dict) -> bool:
    return cell.get("ranks_left") == 0


def row(cell: dict) -> str:
    reason = " ".join(str(cell.get("reason", "")).split())[:160].replace("|", "/")
    first = cell.get("run", "did not finish")
    then = f"failed: {reason}; re-run {cell.get('rerun', '-')}" if first != "SUCCESS" and "run" in cell else first
    problems = cell.get("problems")
    whole = "not checked" if problems is None else "yes" if not problems else f"{len(problems)} problem(s)"
    versions = ", ".join(cell.get("versions", [])) or "-"
    told = " / ".join(cell.get("said", [])).replace("|", "/") or "-"
    return (f"| {cell['service']} | {cell['stage']} | {then} | {told} | {whole} | {versions} | "
            f"{'all held' if held(cell) else 'FAILED'} |")


def main(path: str) -> None:
    cells = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    print("| killed | as this stage started | the run | what its log said of the fault | stores whole | "
          "the day's registered version(s) | promises |")
    print("|---|---|---|---|---|---|---|")
    for cell in cells:
        print(row(cell))
    print(f"RESULT fault_matrix_cells_whole {sum(map(held, cells))} goal == {len(cells)}")


if __name__ == "__main__":
    main(sys.argv[1])
