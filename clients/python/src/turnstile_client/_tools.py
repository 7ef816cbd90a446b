"""Client tools (SPEC §9, ``ServeTools``): tool functions declared with a decorator, served over one stream.

The stream: the client registers its tools, the gateway answers ``registered``, then sends ``call``s (run
here, each in its own task, answered with a ``result``) and ``cancel``s (the call's task is cancelled and
sends nothing: the worker has given up on it). A tool is reachable from every session of the client's
tenant whose agent lists ``client:NAME``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, get_type_hints

import grpc
import grpc.aio

from ._proto.turnstile.v1 import agent_pb2_grpc
from ._retry import RetryPolicy, TurnstileError, _Retries
from ._proto.turnstile.v1 import agent_pb2 as api
from ._proto.turnstile.v1 import events_pb2 as ev

log = logging.getLogger("turnstile_client.tools")

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class ToolContext:
    """What a tool function may ask for by annotating a parameter with this type: the call it answers."""

    session: ev.SessionRef
    call_id: str
    name: str
    deadline_unix_ms: int
    #: ``<tenant>/<session>/<turn>/<step>/<call_id>`` (SPEC §20): the same when the call runs again after its
    #: worker stopped (the agent's ``retry_after_repair``), so a tool can refuse a side effect it already made.
    idempotency_key: str = ""


@dataclass
class ToolOutput:
    """A result with model-visible context messages to insert after it (SPEC §9). A plain return value
    is the output alone (a ``str`` as it is, anything else as JSON)."""

    output: str
    context: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    function: Callable[..., Any]
    context_param: str | None


class Tools:
    """A set of tool functions::

        tools = Tools()

        @tools.tool
        async def lookup(q: str) -> str:
            \"\"\"Looks a word up.\"\"\"
            return f"found {q}"

    The model's JSON arguments are passed as keyword arguments. Name, description and input schema come
    from the function (its name, docstring and annotated parameters) unless given to ``tool(...)``.
    Plain (non-async) functions run in a thread. An exception becomes the call's error result.
    """

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}

    def tool(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
    ) -> Any:
        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            tool_name = name or f.__name__
            if tool_name in self.tools:
                raise ValueError(f"tool {tool_name!r} is declared twice; give one of them another name=")
            schema, context_param = _schema_of(f)
            self.tools[tool_name] = Tool(
                name=tool_name,
                description=description if description is not None else inspect.getdoc(f) or "",
                input_schema=input_schema if input_schema is not None else schema,
                function=f,
                context_param=context_param,
            )
            return f

        return register(function) if function is not None else register

    def specs(self) -> list[api.ClientToolSpec]:
        return [
            api.ClientToolSpec(name=t.name, description=t.description, input_schema_json=json.dumps(t.input_schema))
            for t in self.tools.values()
        ]

    async def run(self, call: api.ToolCallTask) -> api.ToolCallResult:
        """Runs one call and returns its result (an error result for anything that went wrong)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return api.ToolCallResult(call_id=call.call_id, error=f"this executor serves no tool {call.name!r}")
        try:
            arguments = json.loads(call.arguments_json) if call.arguments_json.strip() else {}
            if not isinstance(arguments, dict):
                raise TypeError(f"arguments must be a JSON object, got {call.arguments_json}")
            if tool.context_param is not None:
                arguments[tool.context_param] = ToolContext(
                    call.session, call.call_id, call.name, call.deadline_unix_ms, call.idempotency_key
                )
            if inspect.iscoroutinefunction(tool.function):
                value = await tool.function(**arguments)
            else:
                value = await asyncio.to_thread(tool.function, **arguments)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the tool's failure is the call's result, not the executor's end
            return api.ToolCallResult(call_id=call.call_id, error=f"{type(e).__name__}: {e}")
        if isinstance(value, ToolOutput):
            return api.ToolCallResult(call_id=call.call_id, output=value.output, context=value.context)
        output = value if isinstance(value, str) else json.dumps(value)
        return api.ToolCallResult(call_id=call.call_id, output=output)


def _schema_of(f: Callable[..., Any]) -> tuple[dict[str, Any], str | None]:
    """A JSON Schema object of `f`'s parameters, and the name of its ToolContext parameter if any."""
    try:
        hints = get_type_hints(f)
    except Exception:  # unresolvable annotations: untyped parameters
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_param = None
    for p in inspect.signature(f).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = hints.get(p.name)
        if hint is ToolContext:
            context_param = p.name
            continue
        properties[p.name] = {"type": _JSON_TYPES[hint]} if hint in _JSON_TYPES else {}
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": properties, "required": required}, context_param


class _ToolHost(Protocol):
    """What a :class:`ToolServer` uses of its client (an :class:`~turnstile_client.AsyncClient`)."""

    retry: RetryPolicy

    @property
    def stub(self) -> agent_pb2_grpc.AgentStub: ...

    def _tool_metadata(self) -> tuple[tuple[str, str], ...]: ...

    async def _reconnect(self) -> None: ...


class ToolServer:
    """Serves a :class:`Tools` over ``ServeTools`` for one client, re-registering after UNAVAILABLE (the
    calls in flight on a lost stream fail on the server's side: ``executor ... disconnected``).

    ``await server.run()`` serves until cancelled. ``async with server:`` returns once the gateway accepted
    the registration (``registered`` lists the names) and stops serving at the end of the block. A refused
    registration (a name taken with another schema, say) raises :class:`TurnstileError`.
    """

    def __init__(self, client: _ToolHost, tools: Tools):
        self.client = client
        self.tools = tools
        self.registered: list[str] = []
        self._registered = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ToolServer:
        self._task = asyncio.ensure_future(self.run())
        waiter = asyncio.ensure_future(self._registered.wait())
        await asyncio.wait([self._task, waiter], return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            waiter.cancel()
            self._task.result()  # raises the registration's error
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def run(self) -> None:
        retries = _Retries(self.client._reconnect, self.client.retry, "ServeTools")
        while True:
            try:
                await self._serve_once()
                details = "the ServeTools stream ended"
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise TurnstileError("ServeTools", e.code(), e.details() or "") from e
                details = e.details() or ""
            if self._registered.is_set():
                retries.succeeded()
            self._registered.clear()
            log.info("ServeTools stream lost (%s); registering again", details)
            await retries.after_unavailable(details)

    async def _serve_once(self) -> None:
        outbox: asyncio.Queue[api.ToolWorkerMessage] = asyncio.Queue()
        running: dict[str, asyncio.Task[None]] = {}

        async def messages():
            yield api.ToolWorkerMessage(register=api.RegisterTools(tools=self.tools.specs()))
            while True:
                yield await outbox.get()

        async def answer(call: api.ToolCallTask) -> None:
            try:
                result = await self.tools.run(call)
                await outbox.put(api.ToolWorkerMessage(result=result))
            finally:
                running.pop(call.call_id, None)

        stream = self.client.stub.ServeTools(messages(), metadata=self.client._tool_metadata())
        try:
            async for task in stream:
                kind = task.WhichOneof("task")
                if kind == "registered":
                    self.registered = list(task.registered.tools)
                    self._registered.set()
                elif kind == "call":
                    running[task.call.call_id] = asyncio.ensure_future(answer(task.call))
                elif kind == "cancel":
                    t = running.pop(task.cancel.call_id, None)
                    if t is not None:
                        t.cancel()
                elif kind == "rejected":
                    log.warning("result of call %s refused: %s", task.rejected.call_id, task.rejected.reason)
        finally:
            stream.cancel()
            for t in running.values():
                t.cancel()
