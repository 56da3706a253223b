"""A black-box agent trained through asyncrl's OpenAI-compatible endpoint (env.agent; docs/environments-and-agents.md).

It is an ordinary program that calls an OpenAI chat API: it shows the model a worked example, asks the task,
runs the calculator itself whenever a reply asks for it (`<tool>calc: 12 * 34</tool>`: each request stops at
`</tool>`, so the model cannot go on to invent the result) and sends back the result, and finally returns 1.0 when the last reply's number is the answer after at least one calculator call.
asyncrl records every request token in / token out and trains the model on the replies it sampled.

    python -m asyncrl.run --config configs/smollm2_agent.yaml      (or: make run-agent)
"""
from __future__ import annotations

import re

import openai

from asyncrl.core.envs import calculator, CalculatorEnv
from asyncrl.core.rewards import final_number

CALL = re.compile(r"<tool>\s*calc\s*:(.*?)(</tool>|$)", re.S)


def agent(task: dict) -> float:
    """task: {"prompt", "answer", "prompt_id", "episode_id", "base_url"} (asyncrl.core.agents)."""
    client = openai.OpenAI(base_url=task["base_url"], api_key="asyncrl", max_retries=0)
    example = CalculatorEnv.EXAMPLE
    messages = [
        {"role": "user", "content": CalculatorEnv.PROMPT.format(expression=example)},
        {"role": "assistant", "content": f"<tool>calc: {example}</tool>"},
        {"role": "user", "content": f"<result>{calculator(example)}</result>"},
        {"role": "assistant", "content": f"Answer: {calculator(example)}"},
        {"role": "user", "content": task["prompt"]},
    ]
    calls = 0
    for _ in range(3):  # call, read the result, answer
        reply = client.chat.completions.create(model="policy", messages=messages, user=task["episode_id"], stop=["</tool>"])
        text = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        call = CALL.search(text)
        if call is None:
            return float(calls > 0 and final_number(text) == task["answer"])
        calls += 1
        messages.append({"role": "user", "content": f"<result>{calculator(call.group(1))}</result>"})
    return 0.0
