"""The blocking client: the asyncio client run on an event loop of its own, in a background thread, so the
two behave the same (retries, resumable Watch, tools) and there is one implementation of each."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ._client import AsyncClient
from ._tools import Tools

# The AsyncClient coroutine methods the blocking client offers with the same signature and reply.
_CALLS = (
    "send followup queue steer inject interrupt cancel replace remove splice clear configure_session decide complete_tool_call "
    "set_goal update_goal compact fork_session reference_session delete_session get_inbox get_session when_idle "
    "list_sessions get_usage create_schedule list_schedules delete_schedule set_labels get_transcript list_pending_approvals "
    "create_webhook list_webhooks delete_webhook import_sessions run turn_of "
    "put_agent get_agent list_agents list_agent_versions delete_agent migrate_sessions "
    "put_memory get_memory list_memory search_memory delete_memory"
).split()


class Client:
    """The blocking twin of :class:`AsyncClient` (same arguments, same methods, same replies)::

        with Client("127.0.0.1:7400") as c:
            c.followup("s1", "hello")
            for item in c.watch("s1"):
                ...
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="turnstile-client", daemon=True)
        self._thread.start()
        self.aio = AsyncClient(*args, **kwargs)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.aio.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def tenant(self) -> str:
        return self.aio.tenant

    def ref(self, session: Any) -> Any:
        return self.aio.ref(session)

    message = staticmethod(AsyncClient.message)

    def _iterate(self, stream: AsyncIterator[Any]) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._run(stream.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed():
                self._run(stream.aclose())  # type: ignore[attr-defined]

    @functools.wraps(AsyncClient.watch)
    def watch(self, session: Any, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.watch(session, **kwargs))

    @functools.wraps(AsyncClient.transcript)
    def transcript(self, session: Any, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.transcript(session, **kwargs))

    @functools.wraps(AsyncClient.sessions)
    def sessions(self, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.sessions(**kwargs))

    @functools.wraps(AsyncClient.events)
    def events(self, session: Any, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.events(session, **kwargs))

    @functools.wraps(AsyncClient.evaluate)
    def evaluate(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.evaluate(*args, **kwargs))

    @functools.wraps(AsyncClient.export_sessions)
    def export_sessions(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        return self._iterate(self.aio.export_sessions(*args, **kwargs))

    def serve_tools(self, tools: Tools) -> None:
        """Serves ``tools`` until the process ends (or raises when the stream cannot be had again)."""

        async def serve() -> None:
            await self.aio.serve_tools(tools).run()

        self._run(serve())


def _forward(name: str) -> Any:
    method = getattr(AsyncClient, name)

    @functools.wraps(method)
    def call(self: Client, *args: Any, **kwargs: Any) -> Any:
        return self._run(getattr(self.aio, name)(*args, **kwargs))

    return call


for _name in _CALLS:
    setattr(Client, _name, _forward(_name))
