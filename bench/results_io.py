"""What every benchmark does with its result: print the table, write it and the raw numbers to bench/results/."""
from __future__ import annotations

import json
from pathlib import Path


def publish(out_dir: Path, name: str, table: str, data: object) -> None:
    """Print `table`; write `<name>.md` (the table) and `<name>.json` (`data`) into `out_dir`."""
    print("\n" + table)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.md").write_text(table)
    (out_dir / f"{name}.json").write_text(json.dumps(data, indent=2))


def lengths_text(d: dict) -> str:
    """An `asyncrl.analysis.response_lengths` distribution in one table cell: percentiles, mean, share cut at the limit."""
    cut = d["finish_reasons"].get("length", 0) / d["samples"]
    return f"p50 {d['p50']} / p90 {d['p90']} / p99 {d['p99']} / max {d['max']}, mean {d['mean']:.0f}, {cut:.0%} cut"
