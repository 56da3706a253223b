"""An agent written with OpenAI function calling, as agents are written for any OpenAI-compatible server: it knows
nothing of asyncrl but its base URL (no episode id: the URL names the episode), passes `tools`, runs the calls the
replies ask for and sends their results back as `role: "tool"` messages. asyncrl renders the tools into the prompt
(SmolLM2's chat template has no tool format, so the Hermes one: asyncrl.core.tool_calls), parses each reply's
`<tool_call>` with vLLM's parser, records every turn token in / token out and trains the model on the replies.

It plays the calculator task's records (their prompt names an expression): three worked examples first, in the same
function-calling form (with one, SmolLM2-135M-Instruct wrote no parseable call in 8 samples; with three, 4 in 16),
then the question; the reward is 1.0 when the final answer is the expression's value and the calculator was called.

    python -m asyncrl.run --config configs/smollm2_function_calling.yaml
"""
from __future__ import annotations

import json
import random
import re
import time

import openai

from asyncrl.core.envs import calculator
from asyncrl.core.rewards import final_number

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an integer arithmetic expression (+ - * // % and brackets).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
QUESTION = "Compute {expression} with the calculator tool."
EXAMPLES = ("12 * 34", "5 + 9 * 3", "(8 - 3) * 7")
EXPRESSION = re.compile(r"Compute (.+?)\. ")
"""The expression in a calculator record's prompt (asyncrl.core.envs.CalculatorEnv.PROMPT)."""


def run_calculator(arguments: str) -> str:
    """A call's result, or an error the model reads (as a tool would answer it)."""
    try:
        return calculator(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError):
        return 'error: call calculator with {"expression": "..."}'


def worked_example(expression: str, call_id: str) -> list[dict]:
    """A question, the call the model should make, its result and the answer, as chat messages."""
    call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [{"role": "user", "content": QUESTION.format(expression=expression)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": calculator(expression)},
            {"role": "assistant", "content": f"Answer: {calculator(expression)}"}]


def agent(task: dict, tool_latency_s: tuple[float, float] = (0.0, 0.0)) -> float:
    """task: {"prompt", "answer", "base_url", ...} (asyncrl.core.agents); only the base URL is used to reach the model.
    `tool_latency_s`: each calculator call also waits this long (uniform in the range), as a real tool would."""
    client = openai.OpenAI(base_url=task["base_url"], api_key="none", max_retries=0)
    messages = [m for i, example in enumerate(EXAMPLES) for m in worked_example(example, f"call_{i}")]
    messages.append({"role": "user", "content": QUESTION.format(expression=EXPRESSION.search(task["prompt"]).group(1))})
    called = False
    for _ in range(3):  # call, read the result, answer
        message = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR]).choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return float(called and final_number(message.content or "") == task["answer"])
        for call in message.tool_calls:
            called = True
            time.sleep(random.uniform(*tool_latency_s))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_calculator(call.function.arguments)})
    return 0.0
