"""Print per-group speed-ups from a pytest-benchmark JSON file.

Usage: python benchmarks/ratios.py results.json
For each group: the median time of every row, ops/s, and each row's speed-up
over the slowest row of the group (the baseline measured in the same run).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    with open(path) as fh:
        data = json.load(fh)
    groups: dict[str, list[dict]] = defaultdict(list)
    for bench in data["benchmarks"]:
        groups[bench["group"] or bench["name"]].append(bench)
    for group, rows in groups.items():
        slowest = max(r["stats"]["median"] for r in rows)
        print(f"\n{group}")
        for r in sorted(rows, key=lambda r: r["stats"]["median"]):
            median = r["stats"]["median"]
            per = r.get("extra_info", {}).get("lines") or r.get("extra_info", {}).get("items")
            rate = f"{per / median:>14,.0f} /s" if per else ""
            print(f"  {r['name']:<55} {median * 1e3:>10.2f} ms {rate}  x{slowest / median:.2f}")
            extra = {k: v for k, v in r.get("extra_info", {}).items() if k not in ("lines", "items")}
            if extra:
                print("      " + ", ".join(f"{k}={v}" for k, v in extra.items()))


if __name__ == "__main__":
    main(sys.argv[1])
