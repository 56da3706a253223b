"""Agents that wait between requests against the agents' endpoint: how many requests fail to connect.

    .venv/bin/python examples/diagnostics/endpoint_keepalive.py 4.98 5.02 40          # the endpoint as it is
    .venv/bin/python examples/diagnostics/endpoint_keepalive.py 4.98 5.02 40 --old    # uvicorn's 5 s keep-alive

Each of N agents (threads with an `openai` client, `max_retries=0`) sends 4 requests to its episode's base URL,
waiting a uniform LO..HI seconds after each reply; a thread answers every request at once. With the server's
keep-alive equal to the client's own 5 s expiry (`--old`), waits near 5 s make some requests fail with
`APIConnectionError`; docs/recipes.md quotes the counts (1 to 6 of 160 with --old, 0 without).
"""
from __future__ import annotations

import argparse
import random
import threading
import time

import openai

import asyncrl.core.agent_endpoint as agent_endpoint

REPLY = {"id": "x", "object": "chat.completion", "created": 0, "model": "policy",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lo", type=float)
    parser.add_argument("hi", type=float)
    parser.add_argument("agents", type=int)
    parser.add_argument("--old", action="store_true", help="uvicorn's default keep-alive (5 s), as the endpoint had it")
    args = parser.parse_args()
    if args.old:
        agent_endpoint.keep_alive_s = lambda wait_s: 5
    endpoint, stop = agent_endpoint.Endpoint(0, lambda episode_id: True, 60.0), threading.Event()

    def answer() -> None:
        while not stop.is_set():
            for request in endpoint.take():
                request.answer(REPLY)
            time.sleep(0.002)

    threading.Thread(target=answer, daemon=True).start()
    ok, errors, lock = [0], [], threading.Lock()

    def agent(i: int) -> None:
        client = openai.OpenAI(base_url=endpoint.episode_url(f"e{i}"), api_key="none", max_retries=0)
        for _ in range(4):
            try:
                client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
                with lock:
                    ok[0] += 1
            except openai.APIError as exc:
                with lock:
                    errors.append(repr(exc)[:100])
            time.sleep(random.uniform(args.lo, args.hi))

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(args.agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    endpoint.close()
    print(f"requests {ok[0] + len(errors)}, failed {len(errors)}", errors[:3])


if __name__ == "__main__":
    main()
