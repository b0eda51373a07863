"""The closing lines of scripts/test.sh: one ``NAME: N passed, N failed, N skipped`` line per pytest run.

Usage: python scripts/_pytest_totals.py NAME:JUNIT_XML[,JUNIT_XML...]:EXIT_STATUS ...   (in order)

A name's reports are added up. Exits 1 when a run's pytest failed, wrote no report, or passed no test (a group that silently skipped
everything, e.g. the vLLM group without vLLM, must not look like a green run).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def counts(report: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a pytest ``--junitxml`` report; errors count as failed."""
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def main(runs: list[str]) -> int:
    ok = True
    for run in runs:
        name, rest = run.split(":", 1)
        reports, status = rest.rsplit(":", 1)
        paths = [Path(p) for p in reports.split(",")]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            print(f"{name}: no report {', '.join(missing)} (exit status {status})")
            ok = False
            continue
        passed, failed, skipped = (sum(c) for c in zip(*(counts(p) for p in paths), strict=True))
        print(f"{name}: {passed} passed, {failed} failed, {skipped} skipped")
        ok = ok and status == "0" and passed > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
