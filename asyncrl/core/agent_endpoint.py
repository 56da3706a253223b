"""The agents' OpenAI-compatible endpoint (asyncrl.core.agents): FastAPI on uvicorn, in a daemon thread of the rollout
worker's process.

`POST /v1/chat/completions` parses a request (asyncrl.core.chat_api.parse_request), checks that its episode is running,
queues it for the worker's loop (`Endpoint.take`) and waits up to `wait_s` for the loop's answer without holding the
event loop: the loop's thread wakes the waiting handler through `ChatRequest.on_done`. `GET /v1/models` lists the
one model, "policy". Both are served under each episode's own base URL too, `/episodes/<id>/v1` (`episode_url`),
where the path names the episode: an agent that only takes a base_url needs no episode id. Every error is an OpenAI-style `{"error": {"message", "type"}}`: 400 for a request the endpoint
refuses, 404 for an unknown route or episode, 504 when the loop does not answer in time, or the status the loop failed
the request with. The endpoint is imported only where agents run (AgentHost), so the rest never loads FastAPI.
"""
from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from typing import Callable
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException

from asyncrl.core.chat_api import ChatRequest, ChatRequestError, parse_request

CHAT, MODELS = "/v1/chat/completions", "/v1/models"
EPISODE = "/episodes/{episode_id}"
MODEL_LIST = {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "asyncrl"}]}
START_S = 30.0
"""How long the server may take to start serving."""
GRACE_S = 1
"""How long `close` lets open connections finish (their waiting requests are answered 503 first)."""
KEEP_ALIVE_MARGIN_S = 5
"""An idle connection is kept open this much longer than an agent may take (`wait_s`)."""


class Endpoint:
    """The HTTP server (uvicorn in a daemon thread): each request is checked, queued for the loop and waited for."""

    def __init__(self, port: int, known: Callable[[str], bool], wait_s: float) -> None:
        self.known, self.wait_s = known, wait_s
        self.requests: list[ChatRequest] = []  # queued for the loop (take)
        self.waiting: dict[int, ChatRequest] = {}  # id -> a request whose handler waits for its answer
        self.lock = threading.Lock()
        self.sock = _listen(port)  # bound here: a port in use raises OSError in the caller
        config = uvicorn.Config(self._app(), log_config=None, log_level="warning", access_log=False, lifespan="off",
                                loop="asyncio", timeout_graceful_shutdown=GRACE_S, timeout_keep_alive=keep_alive_s(wait_s))
        self.server = uvicorn.Server(config)  # not in the main thread: uvicorn installs no signal handlers
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="asyncrl-endpoint", daemon=True)
        self.thread.start()
        self._wait_started()
        self.root = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.base_url = self.root + "/v1"

    def episode_url(self, episode_id: str) -> str:
        """The episode's own base URL: requests to it need no `user` or X-Episode-Id."""
        return f"{self.root}/episodes/{quote(episode_id, safe='')}/v1"

    def _wait_started(self) -> None:
        deadline, (host, port) = time.monotonic() + START_S, self.sock.getsockname()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self.sock.close()
                raise RuntimeError(f"the agents' endpoint did not start on {host}:{port} within {START_S:g} s (uvicorn's log says why)")
            time.sleep(0.01)

    def _app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, redirect_slashes=False)

        @app.get(MODELS)
        @app.get(MODELS + "/")
        @app.get(EPISODE + MODELS)
        @app.get(EPISODE + MODELS + "/")
        async def models() -> Response:
            return _reply(200, MODEL_LIST)

        @app.post(CHAT)
        @app.post(CHAT + "/")
        @app.post(EPISODE + CHAT)
        @app.post(EPISODE + CHAT + "/")
        async def chat(request: Request) -> Response:
            try:
                chat = parse_request(await request.body(), request.headers.get("X-Episode-Id"), request.path_params.get("episode_id"))
                if not self.known(chat.episode_id):
                    raise ChatRequestError(404, f"no episode {chat.episode_id!r} is running on this worker (pass the task's episode_id)")
            except ChatRequestError as exc:
                return _reply(exc.status, _error(str(exc)))
            return await self._answer(chat)

        @app.exception_handler(HTTPException)
        async def no_route(request: Request, exc: HTTPException) -> Response:
            if exc.status_code in (404, 405):  # no such path, or not with this method
                routes = f"POST {CHAT}, GET {MODELS}" if request.method == "GET" else f"POST {CHAT}"
                routes += f" (or under {EPISODE})"
                return _reply(404, _error(f"no route {request.url.path}: {routes}"))
            return _reply(exc.status_code, _error(str(exc.detail)))

        return app

    async def _answer(self, request: ChatRequest) -> Response:
        """Queue `request` for the loop and wait up to wait_s for its answer, leaving the event loop free meanwhile."""
        answered = _settled(request)
        with self.lock:
            self.requests.append(request)
            self.waiting[id(request)] = request
        try:
            await asyncio.wait_for(answered, self.wait_s)
        except TimeoutError:
            return _reply(504, _error(f"no reply within {self.wait_s:g} s (env.agent_timeout_s)"))
        finally:
            with self.lock:
                self.waiting.pop(id(request), None)
        if request.error is not None:
            return _reply(request.error.status, _error(str(request.error)))
        return _reply(200, request.body)

    def take(self) -> list[ChatRequest]:
        with self.lock:
            taken, self.requests = self.requests, []
        return taken

    def close(self) -> None:
        """Answer the requests still waiting 503, stop the server and join its thread."""
        with self.lock:
            waiting = [r for r in self.waiting.values() if not r.done.is_set()]
        for request in waiting:
            request.fail(503, "the endpoint closed")
        self.server.should_exit = True
        self.thread.join(GRACE_S + 5)


def keep_alive_s(wait_s: float) -> int:
    """How long the server keeps an idle connection open: longer than an agent may think between two requests
    (`wait_s`, env.agent_timeout_s), so that the server never closes a connection its agent is about to reuse.
    uvicorn's default, 5 s, equals the openai client's own keep-alive expiry (httpx's 5 s): an agent that waited
    about 5 s (a tool call, a slow machine) sent its next request on a connection the server was closing, and got
    `APIConnectionError`. The client still closes its idle connections after its own expiry."""
    return math.ceil(wait_s) + KEEP_ALIVE_MARGIN_S


def _listen(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:port (0: a free port), reusing the address as http.server does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def _settled(request: ChatRequest) -> asyncio.Future[None]:
    """A future of the running event loop, set when the worker's loop answers or fails `request` (from its own thread)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not future.done():  # not timed out
            future.set_result(None)

    def notify() -> None:
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the endpoint has closed
            pass

    request.on_done = notify
    return future


def _reply(status: int, body: dict) -> Response:
    """`body` as JSON, written as json.dumps does (a logprob of -inf stays -Infinity, as the openai client reads it)."""
    return Response(json.dumps(body), status, media_type="application/json")


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}
