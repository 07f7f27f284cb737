"""Read a suite timeline written by `PIPEKIT_SUITE_TIMELINE=path.jsonl uv run pytest`.

```bash
PIPEKIT_SUITE_TIMELINE=/tmp/t.jsonl uv run pytest
uv run python scripts/suite_timeline.py /tmp/t.jsonl          # per worker, then the top units
uv run python scripts/suite_timeline.py /tmp/t.jsonl --top 40
```

Per xdist worker: the work units in the order they ran (a unit is a test file, the Ray
files together, the golden files together, one docs page), the wall time each held the
worker (from the previous unit's last report to its own last), and when the worker went
idle. Then the units by wall time and the tests by summed phase durations; with CPU
seconds in the timeline (its `cpu` field: the worker's and its waited-for children's), the
units and tests by CPU too (what a test costs, where wall time on a loaded machine also
counts the others).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    lines = [json.loads(x) for x in args.timeline.read_text().splitlines() if x.strip()]
    end = max(x["t"] for x in lines)
    units: dict[tuple[str, str], list[float]] = {}  # (worker, unit) -> [first, last] report
    order: dict[str, list[str]] = defaultdict(list)
    tests: dict[str, float] = defaultdict(float)
    cpu_units: dict[str, float] = defaultdict(float)
    cpu_tests: dict[str, float] = defaultdict(float)
    for x in lines:
        key = (x["worker"], x["unit"])
        if key not in units:
            units[key] = [x["t"] - x["duration"], x["t"]]
            order[x["worker"]].append(x["unit"])
        units[key][1] = x["t"]
        tests[x["test"]] += x["duration"]
        if x.get("cpu") is not None:
            cpu_units[x["unit"]] += x["cpu"]
            cpu_tests[x["test"]] += x["cpu"]

    print(f"run: {end:.0f} s from the controller's start to the last report")
    walls: dict[str, float] = {}
    for worker in sorted(order):
        last = 0.0
        print(f"\n{worker}:")
        for unit in order[worker]:
            final = units[(worker, unit)][1]
            wall = final - last
            walls[unit] = wall
            print(f"  {final:7.0f}  {wall:6.0f} s  {unit}")
            last = final
        print(f"  idle after {last:.0f} s ({end - last:.0f} s before the end)")

    print(f"\nunits by wall time (top {args.top}):")
    for unit, wall in sorted(walls.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {wall:6.0f} s  {unit}")
    print(f"\ntests by summed durations (top {args.top}):")
    for test, dur in sorted(tests.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {dur:6.1f} s  {test}")
    if cpu_units:
        print(f"\nCPU: {sum(cpu_units.values()):.0f} s in all after collection")
        print(f"units by CPU (top {args.top}):")
        for unit, cpu in sorted(cpu_units.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {cpu:6.0f} s  {unit}")
        print(f"\ntests by CPU (top {args.top}):")
        for test, cpu in sorted(cpu_tests.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {cpu:6.1f} s  {test}")


if __name__ == "__main__":
    main()
