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
