"""Black-box agents (env.agent) through the real rollout worker, its OpenAI-compatible endpoint, the engine and the store.

A stepped worker (its own actor, the loop run by hand, as in tests/test_episodes.py) serves SmolLM2's chat
template to agents of tests/agents_fixture.py, which call it with the `openai` client: each episode's stored
tokens are exactly the rendered first request, the engine's sampled replies and the tokens of the messages the
agent added (masked, version -1); what the client was answered (text, log-probs, token ids) is what was stored;
bad requests get a clear 4xx and an agent that rewrites its conversation drops its group with the reason.
The request parsing, the conversation check and the HTTP endpoint (asyncrl.core.agent_endpoint, with a thread
standing for the worker's loop) are tested without an engine.
"""
from __future__ import annotations

from http.client import HTTPConnection
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import ray
from transformers import AutoTokenizer

from asyncrl.actors.buffer import ReplayBuffer
from asyncrl.actors.engines import engine_runtime_env
from asyncrl.core.agent_endpoint import Endpoint, keep_alive_s
from asyncrl.core.agents import AWAIT, AgentEnd, AgentRun
from asyncrl.core.chat_api import ChatRequest, ChatRequestError, divergence, normalise_messages, parse_request
from asyncrl.core.episode import EpisodeLimits
from asyncrl.core.config import ConfigError, load_config
from asyncrl.core.chat import observation_ids
from asyncrl.core.store import read_trajectories
from asyncrl.core.chat import AgentCodec, encode_prompt
from asyncrl.core.prompts import Prompt
from tests.agents_fixture import CLOCK, QUESTION, STOP
from tests.test_episodes import SteppedEpisodes
from tests.test_weight_update import ray_session  # noqa: F401 - a fixture

AGENT = ("task.chat=true", "rollout.group_size=2", "rollout.max_new_tokens=8", "env.max_episode_tokens=48",
         "model.max_model_len=320", "run.eval=false")


def test_requests_are_parsed_and_bad_ones_refused_with_the_reason():
    req = parse_request(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "user": "e1",
                                    "max_completion_tokens": 5, "logprobs": True}).encode(), None)
    assert (req.episode_id, req.messages, req.max_tokens, req.logprobs) == ("e1", [{"role": "user", "content": "hi"}], 5, True)
    assert parse_request(b'{"messages": [{"role": "user", "content": "x"}]}', "e2").episode_id == "e2"  # the header
    assert req.stop == () and parse_request(b'{"messages": [{"role": "user", "content": "x"}], "stop": "</tool>"}', "e").stop == ("</tool>",)
    assert parse_request(b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "a"]}', "e").stop == ("a", "b")
    for body, words in (({"messages": [], "user": "e"}, "non-empty"), ({"messages": [{"role": "user", "content": "x"}]}, "episode_id"),
                        ({"messages": [{"role": "bot", "content": "x"}], "user": "e"}, "role"),
                        ({"messages": [{"role": "user", "content": "x"}], "user": "e", "n": 2}, "n=2"),
                        ({"messages": [{"role": "user", "content": "x"}], "user": "e", "max_tokens": 0}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "x"}], "user": "e", "stop": ["a", ""]}, "stop must be"),
                        ({"messages": [{"role": "user", "content": "x"}], "user": "e", "stop": 3}, "stop must be"),
                        ({"messages": [{"role": "user", "content": "x"}], "user": "e", "stop": list("abcde")}, "at most 4")):
        with pytest.raises(ChatRequestError, match=words):
            parse_request(json.dumps(body).encode(), None)
    for payload in (b"{", b"\xff"):  # not JSON, not UTF-8
        with pytest.raises(ChatRequestError, match="not JSON"):
            parse_request(payload, None)
    with pytest.raises(ChatRequestError, match="JSON object"):
        parse_request(b"[]", "e")
    with pytest.raises(ChatRequestError, match="text content"):
        normalise_messages([{"role": "user", "content": [{"type": "image_url"}]}])


def test_a_request_must_repeat_the_conversation_and_add_to_it():
    known = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert divergence(known, known + [{"role": "user", "content": "more"}]) is None
    assert "assistant's reply" in divergence(known, [known[0], {"role": "assistant", "content": "b"}, {"role": "user", "content": "x"}])
    assert "adds no message" in divergence(known, known)
    assert "has 1 messages" in divergence(known, known[:1])


def http(url: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """One request to the endpoint (a GET without a body, else a POST): (status, JSON body)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answering(endpoint: Endpoint, stop: threading.Event) -> threading.Thread:
    """A thread standing for the worker's loop: it answers each request with its last message, fails "fail" with a
    400 and leaves "silent" unanswered."""
    def loop() -> None:
        while not stop.is_set():
            for request in endpoint.take():
                said = request.messages[-1]["content"]
                if said == "fail":
                    request.fail(400, "refused by the loop")
                elif said != "silent":
                    request.answer({"episode": request.episode_id, "said": said, "max_tokens": request.max_tokens})
            time.sleep(0.005)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def ask(episode: str | None, said: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": said}], **({"user": episode} if episode else {}), **extra}


def test_the_endpoint_routes_checks_queues_and_answers_requests():
    endpoint, stop = Endpoint(0, lambda episode_id: episode_id in ("e1", "e2"), wait_s=10.0), threading.Event()
    answering(endpoint, stop)
    url = endpoint.base_url
    try:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/v1")  # port 0: a free one
        models = {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "asyncrl"}]}
        assert http(f"{url}/models") == http(f"{url}/models/") == (200, models)
        assert http(f"{url}/chat/completions", ask("e1", "hi", max_tokens=3)) == (200, {"episode": "e1", "said": "hi", "max_tokens": 3})
        assert http(f"{url}/chat/completions/", ask(None, "hey"), {"X-Episode-Id": "e2"})[1]["episode"] == "e2"
        both = "POST /v1/chat/completions, GET /v1/models (or under /episodes/{episode_id})"
        for route, body, message in (("nope", None, f"no route /v1/nope: {both}"),
                                     ("chat/completions", None, f"no route /v1/chat/completions: {both}"),
                                     ("models", {}, "no route /v1/models: POST /v1/chat/completions (or under /episodes/{episode_id})")):
            assert http(f"{url}/{route}", body) == (404, {"error": {"message": message, "type": "invalid_request_error"}})
        for body, status, words in ((b"{", 400, "not JSON"), (ask(None, "x"), 400, "episode_id"), (ask("e3", "x"), 404, "no episode 'e3'"),
                                    (ask("e1", "x", stream=True), 400, "stream"), (ask("e1", "x", n=2), 400, "n=2"),
                                    (ask("e1", "x", tools=[{"type": "function"}]), 400, "tools[0]"), (ask("e1", "x", max_tokens=0), 400, "max_tokens"),
                                    (ask("e1", "fail"), 400, "refused by the loop")):
            status_got, reply = http(f"{url}/chat/completions", body)
            assert status_got == status and words in reply["error"]["message"] and reply["error"]["type"] == "invalid_request_error"
        replies: list = [None] * 16  # more than the default executor's threads: the waits must not hold threads
        threads = [threading.Thread(target=lambda i=i: replies.__setitem__(i, http(f"{url}/chat/completions", ask("e1", str(i)))))
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert replies == [(200, {"episode": "e1", "said": str(i), "max_tokens": None}) for i in range(16)]
    finally:
        stop.set()
        endpoint.close()


def test_an_agent_that_thinks_between_requests_finds_its_connection_open():
    """An agent that waited about 5 s between two requests (a tool call) used to send the second on a connection
    the server was closing (uvicorn's keep-alive, 5 s, against the openai client's own 5 s expiry): APIConnectionError.
    The server now keeps an idle connection open longer than an agent may take; here one connection is reused
    after 5.5 s of silence, which failed with the old setting."""
    assert keep_alive_s(0.3) > 5 and keep_alive_s(300.0) > 300.0
    endpoint, stop = Endpoint(0, lambda episode_id: True, wait_s=1.0), threading.Event()
    answering(endpoint, stop)
    connection = HTTPConnection("127.0.0.1", int(endpoint.base_url.rsplit(":", 1)[1].split("/")[0]), timeout=30)
    try:
        replies = []
        for said in ("first", "second"):
            connection.request("POST", "/episodes/e/v1/chat/completions", json.dumps(ask(None, said)), {"Content-Type": "application/json"})
            reply = connection.getresponse()
            replies.append((reply.status, json.loads(reply.read())["said"]))
            if said == "first":
                time.sleep(5.5)
        assert replies == [(200, "first"), (200, "second")]
    finally:
        connection.close()
        stop.set()
        endpoint.close()


def test_the_endpoint_times_out_closes_and_refuses_a_port_in_use():
    endpoint, stop = Endpoint(0, lambda episode_id: True, wait_s=0.3), threading.Event()
    answering(endpoint, stop)
    url, port = endpoint.base_url, int(endpoint.base_url.rsplit(":", 1)[1].split("/")[0])
    try:
        timed_out = {"error": {"message": "no reply within 0.3 s (env.agent_timeout_s)", "type": "invalid_request_error"}}
        assert http(f"{url}/chat/completions", ask("e", "silent")) == (504, timed_out)
        with pytest.raises(OSError):
            Endpoint(port, lambda episode_id: True, wait_s=1.0)
    finally:
        stop.set()
        endpoint.close()
    assert not endpoint.thread.is_alive()
    endpoint = Endpoint(port, lambda episode_id: True, wait_s=60.0)  # the port is free again; nobody answers here
    replies: list = []
    waiter = threading.Thread(target=lambda: replies.append(http(f"{endpoint.base_url}/chat/completions", ask("e", "x"))))
    waiter.start()
    deadline = time.monotonic() + 30
    while not endpoint.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    endpoint.close()  # answers the waiting request 503 and stops
    waiter.join(30)
    assert time.monotonic() - t0 < 10 and not endpoint.thread.is_alive()
    assert replies == [(503, {"error": {"message": "the endpoint closed", "type": "invalid_request_error"}})]


class CharCodec:
    """A "tokenizer" of one token per character of each message (EOS is 0), standing for asyncrl.core.chat.AgentCodec."""

    def prompt_ids(self, messages, tools):
        return [ord(c) for m in messages for c in m["content"]]

    def delta_ids(self, messages, after_eos):
        return self.prompt_ids(messages, None)

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i)

    def tokens(self, ids):
        return [chr(i) for i in ids]


def hand_run(max_turns=3, max_tokens=20) -> AgentRun:
    return AgentRun("e", EpisodeLimits(max_turns, max_tokens, 4), CharCodec(), frozenset({0}), 100)


def test_an_agent_episode_masks_the_added_messages_and_answers_each_request():
    run = hand_run()
    first = ChatRequest("e", [{"role": "user", "content": "ab"}], max_tokens=2, logprobs=True)
    run.tool_done(first)
    assert run.pending is None and run.episode.prompt_ids == [97, 98] and run.turn_budget() == 2  # the request's max_tokens
    assert run.model_turn([120, 0], [-0.5, -0.1], [3, 3]) is AWAIT
    reply = first.body
    assert reply["choices"][0]["message"]["content"] == "x" and reply["choices"][0]["finish_reason"] == "stop"
    assert [c["logprob"] for c in reply["choices"][0]["logprobs"]["content"]] == [-0.5, -0.1]
    assert reply["asyncrl"] == {"episode_id": "e", "token_ids": [120, 0], "token_versions": [3, 3]}
    second = ChatRequest("e", [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "cd"}])
    run.tool_done(second)
    run.model_turn([121], [-0.2], [4])
    run.tool_done(AgentEnd(0.5))
    ep = run.episode
    assert ep.response_ids == [120, 0, 99, 100, 121] and ep.loss_mask == [1, 1, 0, 0, 1]  # only "cd" added, masked
    assert ep.token_versions == [3, 3, -1, -1, 4] and ep.behavior_logprobs == [-0.5, -0.1, 0.0, 0.0, -0.2]
    assert run.finish_reason == "stop" and run.end.reward == 0.5 and second.body["choices"][0]["finish_reason"] == "stop"


def test_an_agent_episode_ends_at_its_limits_and_refuses_the_request_that_would_pass_them():
    def two_requests(run):
        ask = ChatRequest("e", [{"role": "user", "content": "q"}])
        run.tool_done(ask)
        run.model_turn([120, 0], [0.0, 0.0], [0, 0])
        more = ChatRequest("e", ask.messages + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "again please"}])
        run.tool_done(more)
        return more

    run = hand_run(max_turns=1)
    refused = two_requests(run)
    assert run.finish_reason == "max_turns" and run.end.reward == 0.0 and refused.error.status == 400 and "env.max_turns=1" in str(refused.error)
    run = hand_run(max_tokens=10)
    refused = two_requests(run)
    assert run.finish_reason == "length" and "env.max_episode_tokens=10" in str(refused.error)
    run = hand_run()
    run.tool_done(AgentEnd(1.0))  # returned without a request: an error, not a reward
    assert run.finish_reason == "tool_error" and "without asking" in run.end.reason


def test_agent_config_is_checked_at_load():
    good = ["env.agent=tests.agents_fixture.two_turns", "task.chat=true", "run.eval=false", "model.max_model_len=512"]
    assert load_config(None, good).env.agent == "tests.agents_fixture.two_turns"
    for extra, key in ((["env.agent=tests.agents_fixture.nothing"], "env.agent"), (["task.chat=false"], "task.chat"),
                       (["rollout.weight_update=abort"], "rollout.weight_update"),
                       (["env.name=calculator"], "env.agent")):
        with pytest.raises(ConfigError) as err:
            load_config(None, good + extra)
        assert err.value.key == key


@pytest.fixture(scope="module")
def played(smollm2_dir, ray_session, tmp_path_factory):  # noqa: F811
    """Three groups of two episodes: tests.agents_fixture.two_turns in the first, misbehaving in the second,
    function_calling in the third."""
    tmp = tmp_path_factory.mktemp("agents")
    rows, seen, evals = play(smollm2_dir, tmp / "store", tmp, "tests.agents_fixture.by_group", groups=3)
    return rows, seen, tmp, evals


def play(smollm2_dir, store, log, agent: str, groups: int):
    cfg = load_config(None, [f"env.agent={agent}", *AGENT])
    buffer = ray.remote(ReplayBuffer).remote(cfg, str(store))
    worker = ray.remote(SteppedEpisodes).options(
        num_cpus=1, runtime_env={**engine_runtime_env("vllm", on_gpu=False), "env_vars": {"ASYNCRL_AGENT_LOG": str(log)}}).remote(
        0, cfg, smollm2_dir, buffer, "t")
    try:
        seen = ray.get(worker.play.remote(groups))
        ray.get(worker.stop.remote())
        ray.get(buffer.close.remote())
        evals = ray.get(worker.episodes.remote([Prompt("q", "What is 2 + 2?", "4")] * 2, greedy=True))  # after stop, as a run's last evaluation
    finally:
        ray.kill(worker)
    return read_trajectories(store).to_pylist(), seen, evals


@pytest.mark.slow
def test_an_agents_episode_is_recorded_token_in_token_out(played, smollm2_dir):
    rows, seen, tmp_path, _ = played
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert len(rows) == 6 and len({r["sample_id"] for r in rows}) == 6
    rows = [r for r in rows if "-g0-" in r["sample_id"]]
    assert len(rows) == 2
    stopped = 0
    for r in rows:
        assert r["status"] == "unconsumed_at_end" and r["finish_reason"] == "stop" and r["episode_end"] == "the agent returned"
        log = json.loads((tmp_path / f"{r['sample_id']}.json").read_text())
        first_messages = [{"role": "system", "content": QUESTION}, {"role": "user", "content": r["prompt_text"]}]
        assert r["prompt_ids"] == encode_prompt(tok, first_messages, chat=True)  # the first request, rendered
        turns, ids, mask, lps = r["turns"], r["response_ids"], r["loss_mask"], r["behavior_logprobs"]
        assert [t["role"] for t in turns] == ["model", "observation", "model"]
        engine_turns = seen[r["sample_id"]]
        for t, (sampled, logprobs, _), reply in zip([turns[0], turns[2]], engine_turns, log["replies"]):
            assert ids[t["start"]:t["end"]] == sampled == reply["asyncrl"]["token_ids"]  # stored = sampled = answered
            assert mask[t["start"]:t["end"]] == [1] * len(sampled)
            answered = [c["logprob"] for c in reply["choices"][0]["logprobs"]["content"]]
            assert lps[t["start"]:t["end"]] == pytest.approx(logprobs, abs=1e-6) and answered == pytest.approx(logprobs, abs=1e-6)
            assert reply["choices"][0]["message"]["content"] == tok.decode(sampled, skip_special_tokens=True) == t["text"]
            assert reply["asyncrl"]["token_versions"] == [0] * len(sampled)
        assert len(engine_turns[0][0]) <= 6  # the request's max_tokens
        second = engine_turns[1][0]  # asked with stop=STOP: it ends at the first stop string sampled, keeping its tokens
        assert not any(s in tok.decode(second[:-1], skip_special_tokens=True) for s in STOP), "a turn went on past a stop string"
        stopped += any(s in tok.decode(second, skip_special_tokens=True) for s in STOP)
        obs = turns[1]
        closed = ids[obs["start"] - 1] == tok.eos_token_id
        added = [{"role": "user", "content": "And then?"}]  # only the message the agent added is tokenised
        assert ids[obs["start"]:obs["end"]] == observation_ids(tok, added, chat=True, after_eos=closed)
        assert mask[obs["start"]:obs["end"]] == [0] * (obs["end"] - obs["start"]) and set(r["token_versions"][obs["start"]:obs["end"]]) == {-1}
        assert r["reward"] == float(len(log["replies"][1]["choices"][0]["message"]["content"]) > len(log["replies"][0]["choices"][0]["message"]["content"]))
    assert stopped, f"no second reply reached a stop string of {STOP}"


@pytest.mark.slow
def test_bad_requests_are_refused_and_a_rewritten_conversation_drops_its_group(played):
    rows, _, tmp_path, _ = played
    rows = [r for r in rows if "-g1-" in r["sample_id"]]
    assert len(rows) == 2 and {r["status"] for r in rows} == {"dropped_error"}
    for r in rows:
        assert r["episode_end"].startswith("a request does not continue its episode: messages[1] (assistant) differs")
        errors = json.loads((tmp_path / f"{r['sample_id']}.json").read_text())["errors"]
        assert errors["unknown_episode"][0] == 404 and "no-such-episode" in errors["unknown_episode"][1]
        assert errors["no_episode"][0] == 400 and "episode_id" in errors["no_episode"][1]
        assert errors["stream"][0] == 400 and "stream" in errors["stream"][1]
        assert errors["tools"][0] == 400 and "tools[0].function.parameters['type'] is not a valid JSON Schema" in errors["tools"][1]
        assert errors["rewritten"][0] == 400 and "repeat the conversation" in errors["rewritten"][1]


@pytest.mark.slow
def test_the_evaluation_plays_agents_greedily_through_the_endpoint(played):
    *_, evals = played
    assert len(evals) == 2 and all(e["finish_reason"] == "stop" and e["episode_end"] == "the agent returned" for e in evals)
    assert [[t["role"] for t in e["turns"]] for e in evals] == [["model", "observation", "model"]] * 2
    assert evals[0]["response_ids"] == evals[1]["response_ids"] and evals[0]["reward"] in (0.0, 1.0)  # greedy: the same prompt, the same episode


@pytest.mark.slow
def test_a_function_calling_agent_with_only_its_base_url_is_recorded_token_in_token_out(played, smollm2_dir):
    rows, seen, tmp_path, _ = played
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    codec = AgentCodec(tok)
    rows = [r for r in rows if "-g2-" in r["sample_id"]]
    assert len(rows) == 2
    for r in rows:
        assert r["status"] == "unconsumed_at_end" and r["episode_end"] == "the agent returned", r["status_reason"]
        log = json.loads((tmp_path / f"{r['sample_id']}.json").read_text())
        assert r["prompt_ids"] == codec.prompt_ids([{"role": "user", "content": r["prompt_text"]}], [CLOCK])  # the tools rendered
        assert "<tools>" in tok.decode(r["prompt_ids"]) and '"name": "clock"' in tok.decode(r["prompt_ids"])
        turns, ids = r["turns"], r["response_ids"]
        assert [t["role"] for t in turns] == ["model", "observation", "model"]
        for t, (sampled, _, _), reply in zip([turns[0], turns[2]], seen[r["sample_id"]], log["replies"]):
            assert ids[t["start"]:t["end"]] == sampled == reply["asyncrl"]["token_ids"]  # stored = sampled = answered
            text, parsed = codec.parse(tok.decode(sampled, skip_special_tokens=True), [CLOCK])
            message = reply["choices"][0]["message"]
            assert [c["function"]["name"] for c in message["tool_calls"] or []] == [c["function"]["name"] for c in parsed]
            assert (message["content"] or "") == (text or "") and reply["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
        obs = turns[1]
        closed = ids[obs["start"] - 1] == tok.eos_token_id
        assert ids[obs["start"]:obs["end"]] == codec.delta_ids(normalise_messages(log["added"]), after_eos=closed)
        assert r["loss_mask"][obs["start"]:obs["end"]] == [0] * (obs["end"] - obs["start"])
