"""GSM8K-shaped arithmetic word problems in verl's Parquet layout, generated here (nothing is downloaded).

    python examples/gsm8k_like/make_data.py --out examples/gsm8k_like/data      # train.parquet, val.parquet

Each record has verl's columns: data_source, prompt (a list of chat messages), ability, reward_model = {style,
ground_truth} and extra_info = {split, index, question, answer, answer_format}. `answer` is GSM8K's form, the
worked steps then ``#### N``; `answer_format` is the marker the prompt asks the final answer after ("####" or
"Answer:"), drawn per record, which examples/gsm8k_like/reward.py reads. configs/smollm2_gsm8k_parquet.yaml
trains on the two files without any conversion.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from asyncrl.core.tasks import word_problem

DATA_SOURCE = "gsm8k_like"
INSTRUCTIONS = {
    "####": "Let's think step by step and output the final answer after \"####\".",
    "Answer:": "Think step by step, then end your reply with the final answer in the form 'Answer: N'.",
}


def worked_answer(question: str, answer: int) -> str:
    """GSM8K's answer text for a generated problem: one line per step, then ``#### N`` (the steps are read back from
    the sentences word_problem writes)."""
    lines, total = [], None
    for sentence in question.split(". "):
        words = sentence.rstrip(".?").split()
        numbers = [int(w) for w in words if w.isdigit()]
        if total is None:
            total = numbers[0]
        elif "more" in words:
            lines.append(f"{total} + {numbers[0]} = {total + numbers[0]}.")
            total += numbers[0]
        elif "times" in words:
            lines.append(f"{total} * {numbers[0]} = {total * numbers[0]}.")
            total *= numbers[0]
        elif numbers:
            lines.append(f"{total} - {numbers[0]} = {total - numbers[0]}.")
            total -= numbers[0]
    if total != answer:
        raise AssertionError(f"read {total} back from {question!r}, the generator says {answer}")
    return "\n".join(lines + [f"#### {answer}"])


def record(question: str, answer: int, split: str, index: int, answer_format: str) -> dict:
    """One problem as verl lays a GSM8K record out."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTIONS[answer_format]}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": worked_answer(question, answer),
                       "answer_format": answer_format},
    }


def problems(n: int, steps: int, rng: random.Random, exclude: set[str]) -> list[tuple[str, int]]:
    """`n` distinct problems of 1..`steps` operations, none of them in `exclude`."""
    found: dict[str, int] = {}
    while len(found) < n:
        question, answer = word_problem(rng, rng.randint(1, steps))
        if question not in exclude:
            found.setdefault(question, answer)
    return list(found.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for train.parquet and val.parquet")
    parser.add_argument("--train", type=int, default=2000, help="training problems")
    parser.add_argument("--val", type=int, default=200, help="held-out problems (none of them in train)")
    parser.add_argument("--steps", type=int, default=1, help="most operations in one problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    val = problems(args.val, args.steps, rng, set())
    train = problems(args.train, args.steps, rng, {q for q, _ in val})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("val", val)):
        records = [record(q, a, split, i, rng.choice(list(INSTRUCTIONS))) for i, (q, a) in enumerate(rows)]
        pq.write_table(pa.Table.from_pylist(records), out / f"{split}.parquet")
        print(f"{out / f'{split}.parquet'}: {len(records)} records")


if __name__ == "__main__":
    main()
