"""The trajectory schema: one record per generated sample, whatever its fate.

`SCHEMA_VERSION` is written into every record; readers check it. A sample ends
in exactly one `Status`.

Version 2 added `token_versions` (the policy version that sampled each response
token); version-1 records read with it null (`READABLE` lists what a reader takes).
Version 3 added what a multi-turn episode (env.name) records: `loss_mask` (1 for a
token the model sampled, 0 for an appended observation token), `turns` (each
turn's span of the response tokens, its role, the tool it called or answered and
an observation's text) and `episode_end` (why the environment ended it);
single-turn samples and older parts read them null. In an episode,
`token_versions` is -1 and `behavior_logprobs` 0.0 at observation tokens.
"""
from __future__ import annotations

from enum import Enum

import pyarrow as pa

SCHEMA_VERSION = 3
READABLE = (1, 2, 3)


class Status(str, Enum):
    CONSUMED = "consumed"
    """Trained on at learner version `consumed_version`."""
    DROPPED_STALE = "dropped_stale"
    """Reached the learner past `buffer.max_staleness`."""
    FILTERED = "filtered"
    """Its group's rewards were all equal (algorithm.filter_zero_variance): no learning signal, never trained on."""
    DROPPED_ERROR = "dropped_error"
    """Could not be scored or generated; `status_reason` says why."""
    UNCONSUMED_AT_END = "unconsumed_at_end"
    """Finished, still in the buffer when the run stopped."""
    ABORTED_AT_END = "aborted_at_end"
    """Still generating when the run stopped."""


TURN = pa.struct([("role", pa.string()), ("start", pa.int32()), ("end", pa.int32()), ("tool", pa.string()), ("text", pa.string())])
"""One turn of an episode (asyncrl.core.episode.Turn): role "model" or "observation", its [start, end) in response_ids."""

SAMPLE_SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("run_id", pa.string()),
        ("sample_id", pa.string()),
        ("group_id", pa.string()),
        ("prompt_id", pa.string()),
        ("worker_id", pa.int32()),
        ("prompt_text", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_text", pa.string()),
        ("behavior_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("finish_reason", pa.string()),
        ("policy_version_start", pa.int64()),
        ("policy_version_end", pa.int64()),
        ("token_versions", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int8())),
        ("turns", pa.list_(TURN)),
        ("episode_end", pa.string()),
        ("consumed_version", pa.int64()),
        ("consumed_step", pa.int64()),
        ("status", pa.string()),
        ("status_reason", pa.string()),
        ("t_submitted", pa.float64()),
        ("t_generated", pa.float64()),
        ("t_scored", pa.float64()),
        ("t_consumed", pa.float64()),
    ]
)

FIELDS = tuple(SAMPLE_SCHEMA.names)


def new_sample(**values: object) -> dict:
    """A record with every schema field present (missing ones None)."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise KeyError(f"not in the sample schema: {sorted(unknown)}")
    record = dict.fromkeys(FIELDS)
    record.update(values, schema_version=SCHEMA_VERSION)
    return record
