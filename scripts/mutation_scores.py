"""Per-module mutation scores of a cosmic-ray session (make mutation; docs/testing.md).

cosmic-ray runs the pending mutants in random order, so a run stopped early still gives an
unbiased sample of each module: the score is killed / (killed + survived) over the mutants
run so far, and the table says how many those are. Survivors are listed with their line.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome

CONFIG = Path(__file__).with_name("mutation.toml")


def excluded_operators() -> re.Pattern[str]:
    """The config's exclusions, applied again here: a session started before an exclusion
    was added still reports as if it had been there."""
    config = tomllib.loads(CONFIG.read_text())
    patterns = config["cosmic-ray"]["filters"]["operators-filter"]["exclude-operators"]
    return re.compile("|".join(f"(?:{p})" for p in patterns))


def main(session: str) -> None:
    excluded = excluded_operators()
    with use_db(session, WorkDB.Mode.open) as db:
        total: dict[str, int] = defaultdict(int)
        for item in db.work_items:
            if not excluded.match(item.mutations[0].operator_name):
                total[str(item.mutations[0].module_path)] += 1
        killed: dict[str, int] = defaultdict(int)
        survived: dict[str, list[str]] = defaultdict(list)
        other: dict[str, int] = defaultdict(int)
        for item, result in db.completed_work_items:
            mutation = item.mutations[0]
            module = str(mutation.module_path)
            if excluded.match(mutation.operator_name):
                continue
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                total[module] -= 1
            elif result.test_outcome == TestOutcome.KILLED:
                killed[module] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                where = f"{module}:{mutation.start_pos[0]}"
                survived[module].append(f"{where} {mutation.operator_name} #{mutation.occurrence}")
            else:
                other[module] += 1
    print(f"{'module':40} {'mutants':>7} {'run':>5} {'killed':>6} {'survived':>8} {'other':>5} {'score':>6}")
    for module in sorted(total):
        k, s, o = killed[module], len(survived[module]), other[module]
        score = f"{100 * k / (k + s):5.1f}%" if k + s else "    -"
        print(f"{module:40} {total[module]:7} {k + s + o:5} {k:6} {s:8} {o:5} {score:>6}")
    print("\nsurvivors:")
    for module in sorted(survived):
        for line in sorted(survived[module], key=lambda t: int(t.split(":")[1].split()[0])):
            print("  " + line)


if __name__ == "__main__":
    main(sys.argv[1])
