"""Append-only Parquet store of every sample (trajectories/part-NNNNN.parquet).

Each flush writes a new part file through a temporary name and an atomic
rename, so a run killed mid-way leaves only whole files behind. A flush
happens every `flush_rows` records or `flush_s` seconds, whichever comes
first, so a killed run loses at most that much of its record.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from asyncrl.core.schema import READABLE, SAMPLE_SCHEMA, SCHEMA_VERSION


class TrajectoryStore:
    def __init__(self, directory: str | Path, flush_rows: int = 512, flush_s: float = 10.0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self._last_flush = time.monotonic()
        self._pending: list[dict] = []
        self._next_part = len(list(self.directory.glob("part-*.parquet")))
        self.rows_written = 0

    def append(self, records: list[dict]) -> None:
        self._pending.extend(records)
        if len(self._pending) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        table = pa.Table.from_pylist(self._pending, schema=SAMPLE_SCHEMA)
        final = self.directory / f"part-{self._next_part:05d}.parquet"
        tmp = final.with_suffix(".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        self._next_part += 1
        self.rows_written += len(self._pending)
        self._pending = []


def read_trajectories(directory: str | Path) -> pa.Table:
    """All part files of a run's store as one table in today's schema (older parts get the columns added since,
    null); checks the schema version."""
    parts = sorted(Path(directory).glob("part-*.parquet"))
    if not parts:
        return SAMPLE_SCHEMA.empty_table()
    tables = [pq.read_table(p) for p in parts]
    versions = {v for t in tables for v in t.column("schema_version").to_pylist()}
    if versions - set(READABLE):
        raise ValueError(f"trajectory schema versions {sorted(versions)} unsupported (reader is {SCHEMA_VERSION}; reads {list(READABLE)})")
    return pa.concat_tables([_upgraded(t) for t in tables])


def _upgraded(table: pa.Table) -> pa.Table:
    """`table` with every column of SAMPLE_SCHEMA, in its order (a column added since it was written: null)."""
    columns = [table.column(f.name).cast(f.type) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
               for f in SAMPLE_SCHEMA]
    return pa.Table.from_arrays(columns, schema=SAMPLE_SCHEMA)
