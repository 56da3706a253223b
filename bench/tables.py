"""Rebuild every benchmark table in bench/results/ from its committed JSON record (no measurement runs).

    .venv/bin/python bench/tables.py            # rewrite each <name>.md that has a <name>.json record
    .venv/bin/python bench/tables.py --check    # write nothing; exit 1 listing the tables that differ from their JSON

A record is `{"bench": <module in bench/>, "meta": {...}, "result": {...}}` (results_io.publish); its table is
`results_io.render_record(record)`. Tables without a record (their data was not kept) cannot be rebuilt: they are
listed as not regenerable and left alone.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import render_record  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def survey(results: Path = RESULTS) -> tuple[dict[str, str], list[str]]:
    """({table name: the table its record renders}, [names of tables without a record])."""
    rendered, orphans = {}, []
    for name in sorted({p.stem for p in results.glob("*.md")} | {p.stem for p in results.glob("*.json")}):
        path = results / f"{name}.json"
        record = json.loads(path.read_text()) if path.is_file() else None
        if isinstance(record, dict) and "bench" in record:
            rendered[name] = render_record(record)
        else:
            orphans.append(name)
    return rendered, orphans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table differs from its record")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rendered, orphans = survey(args.results)
    differ = [n for n, text in rendered.items() if not (args.results / f"{n}.md").is_file() or (args.results / f"{n}.md").read_text() != text]
    if not args.check:
        for n in differ:
            (args.results / f"{n}.md").write_text(rendered[n])
    print(f"{len(rendered)} tables from their JSON records; " + (f"{'differ' if args.check else 'rewritten'}: {', '.join(differ)}" if differ else "all up to date"))
    if orphans:
        print(f"not regenerable (no JSON record, left as they are): {', '.join(orphans)}")
    if args.check and differ:
        sys.exit(f"bench/tables.py --check: {len(differ)} table(s) differ from their JSON record: {', '.join(differ)} "
                 "(a table edited by hand, or a change of its benchmark's render(): run `python bench/tables.py`)")


if __name__ == "__main__":
    main()
