"""The asyncio client: every RPC of `turnstile.v1.Agent`, typed helpers, retries and a resumable Watch."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from ._proto.turnstile.v1 import agent_pb2 as api
from ._proto.turnstile.v1 import agent_pb2_grpc
from ._proto.turnstile.v1 import events_pb2 as ev
from ._events import EventFolder, RunFolder, RunResult, TurnEvent, text_of
from ._retry import NO_RETRY, RetryPolicy, TurnstileError, _Retries
from ._tools import ToolServer, Tools

#: Where a server is: ``"host:port"`` or ``"http://host:port"``, or a function returning one, asked again
#: after every UNAVAILABLE (a gateway that came back elsewhere, say).
Address = str | Callable[[], str]
#: A message: a text, or a whole ``UserMessage`` (its id is minted when empty).
MessageLike = str | ev.UserMessage
#: A session: its id (in the client's tenant) or a ``SessionRef``.
SessionLike = str | ev.SessionRef

R = TypeVar("R")

RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000))

#: The header naming the tenant of a tool executor when the server runs without auth.
TENANT_HEADER = "turnstile-tenant"


def _normalise(address: str) -> str:
    for scheme in ("http://", "grpc://"):
        if address.startswith(scheme):
            return address[len(scheme) :].rstrip("/")
    if address.startswith("https://"):
        raise ValueError(f"{address}: for TLS pass credentials=grpc.ssl_channel_credentials(...) and host:port")
    return address


def text_message(text: str, *, id: str | None = None, source: ev.MessageSource | None = None) -> ev.UserMessage:
    """A ``UserMessage`` of one text block, with a fresh MessageId unless ``id`` is given."""
    message = ev.UserMessage(id=id or str(uuid.uuid4()), content=[ev.ContentBlock(text=ev.TextBlock(text=text))])
    if source is not None:
        message.source.CopyFrom(source)
    return message


@dataclass(frozen=True)
class WatchPosition:
    """Where a watch stands: what it would ask the server for if it reopened now (``WatchStream.position``);
    pass it as ``watch(from_=...)`` to go on from there (after a restart of the program, say)."""

    #: The last durable seq received.
    after_seq: int
    #: The step whose output was streaming and the byte offsets received (``WatchRequest.resume``).
    streaming: api.StreamResume | None = None


class _StreamingStep:
    """Where a Watch stands in the output of the step that streams (SPEC §14): the next UTF-8 byte offset of
    its reply text and of its reasoning, advanced by the deltas yielded to the caller. A reopened stream
    sends it as ``resume``, so the server sends only the bytes after it; it is forgotten when the step's
    durable ``assistant/message`` (or its end) arrives, which holds the whole text."""

    def __init__(self) -> None:
        self.at: tuple[int, int] | None = None
        self.text = 0
        self.reasoning = 0

    def advance(self, item: api.WatchItem) -> None:
        kind = item.WhichOneof("item")
        if kind == "live" and item.live.WhichOneof("payload") == "assistant_delta":
            d = item.live.assistant_delta
            if self.at != (d.turn, d.step):
                self.at, self.text, self.reasoning = (d.turn, d.step), 0, 0
            end = d.offset + len(d.text.encode("utf-8"))
            if d.reasoning:
                self.reasoning = max(self.reasoning, end)
            else:
                self.text = max(self.text, end)
        elif kind == "event" and self.at is not None:
            e = item.event
            payload = e.WhichOneof("payload")
            if payload in ("assistant_message", "step_end"):
                ended = getattr(e, payload)
                if (ended.turn, ended.step) == self.at:
                    self.at = None
            elif payload == "turn_end" and e.turn_end.turn == self.at[0]:
                self.at = None

    def resume(self) -> api.StreamResume | None:
        if self.at is None:
            return None
        turn, step = self.at
        return api.StreamResume(turn=turn, step=step, text_offset=self.text, reasoning_offset=self.reasoning)

    @classmethod
    def of(cls, resume: api.StreamResume | None) -> _StreamingStep:
        step = cls()
        if resume is not None:
            step.at, step.text, step.reasoning = (resume.turn, resume.step), resume.text_offset, resume.reasoning_offset
        return step


class WatchStream:
    """A session's Watch as an async iterator of ``WatchItem``s (``AsyncClient.watch``), with the
    ``position`` it would reopen from. ``aclose()`` (or leaving ``async for`` by ``break``) ends it."""

    def __init__(self, items: AsyncIterator[api.WatchItem], state: dict[str, Any]):
        self._items = items
        self._state = state

    @property
    def position(self) -> WatchPosition:
        return WatchPosition(self._state["after_seq"], self._state["streaming"].resume())

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> api.WatchItem:
        return await self._items.__anext__()

    async def aclose(self) -> None:
        await self._items.aclose()  # type: ignore[attr-defined]



def _output_schema(value) -> api.OutputSchema:
    """``output_schema=``: an ``api.OutputSchema``, or a dict ``{"name"?, "schema", "strict"?}`` whose ``schema`` is
    a JSON object (or its text): the schema the reply of the turn must match (SPEC §20)."""
    if isinstance(value, api.OutputSchema):
        return value
    schema = value["schema"]
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return api.OutputSchema(name=value.get("name", "output"), schema_json=text, strict=bool(value.get("strict", False)))

class AsyncClient:
    """A client of one Turnstile deployment (a gateway or ``turnstile dev``), for asyncio.

    ``tenant`` names the sessions given by id (default ``"default"``, or the token's tenant with
    ``token``). Every method of ``turnstile.v1.Agent`` has a method here returning the reply message;
    ``stub`` is the generated stub for anything else. Use as ``async with AsyncClient(...) as c:``.
    """

    def __init__(
        self,
        address: Address = "127.0.0.1:7400",
        *,
        tenant: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retry: RetryPolicy = RetryPolicy(),
        options: Sequence[tuple[str, Any]] = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ):
        self._address = address
        self.tenant = tenant if tenant is not None else ("" if token else "default")
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = credentials
        self.retry = retry
        # Redial a lost server soon: grpc's default backoff grows to 120 s, longer than any retry here.
        given = {key for key, _ in options}
        self._options = list(options) + [(k, v) for k, v in RECONNECT_OPTIONS if k not in given]
        self._interceptors = list(interceptors)
        self._channel: grpc.aio.Channel | None = None
        self._retired: list[grpc.aio.Channel] = []
        self._target: str | None = None
        self._stub: agent_pb2_grpc.AgentStub | None = None

    # --- connection -------------------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in [*self._retired, self._channel]:
            if channel is not None:
                await channel.close()
        self._retired.clear()
        self._channel = self._stub = self._target = None

    @property
    def target(self) -> str:
        """The ``host:port`` the client dials now."""
        if self._target is None:
            self._connect()
        assert self._target is not None  # set by _connect
        return self._target

    @property
    def stub(self) -> agent_pb2_grpc.AgentStub:
        """The generated ``AgentStub`` on the current channel (pass ``metadata=client.metadata``)."""
        if self._stub is None:
            self._connect()
        assert self._stub is not None  # set by _connect
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def _resolve(self) -> str:
        return _normalise(self._address() if callable(self._address) else self._address)

    def _connect(self) -> None:
        target = self._resolve()
        if self._credentials is not None:
            self._channel = grpc.aio.secure_channel(
                target, self._credentials, options=self._options, interceptors=self._interceptors
            )
        else:
            self._channel = grpc.aio.insecure_channel(target, options=self._options, interceptors=self._interceptors)
        self._target = target
        self._stub = agent_pb2_grpc.AgentStub(self._channel)

    async def _reconnect(self) -> None:
        """After UNAVAILABLE: asks the address again and dials anew if it moved (the old channel would go
        on dialling the old address)."""
        if self._channel is None or self._resolve() != self._target:
            # The old channel is retired, not closed: closing it would cancel the streams still open on
            # it (a Watch that has not noticed yet), which end by themselves when their server is gone.
            if self._channel is not None:
                self._retired.append(self._channel)
            self._connect()

    async def _unary(self, method: str, request: Any, *, retry: bool, timeout: float | None = None) -> Any:
        retries = _Retries(self._reconnect, self.retry if retry else NO_RETRY, method)
        while True:
            try:
                return await getattr(self.stub, method)(request, metadata=self._metadata, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise TurnstileError(method, e.code(), e.details() or "") from e
                details = e.details() or ""
            await retries.after_unavailable(details)

    # --- values -----------------------------------------------------------------------------------------

    def ref(self, session: SessionLike) -> ev.SessionRef:
        """A ``SessionRef``: an id in this client's tenant, or the given ref."""
        if isinstance(session, ev.SessionRef):
            return session
        return ev.SessionRef(tenant=self.tenant, id=session)

    @staticmethod
    def message(message: MessageLike, *, id: str | None = None, source: ev.MessageSource | None = None) -> ev.UserMessage:
        """A ``UserMessage`` with a MessageId: the one given, the message's own, or a fresh UUID. The id is
        minted once per call of a helper, so every retry of that call carries the same one."""
        if isinstance(message, str):
            return text_message(message, id=id, source=source)
        out = ev.UserMessage()
        out.CopyFrom(message)
        if id is not None:
            out.id = id
        elif not out.id:
            out.id = str(uuid.uuid4())
        if source is not None:
            out.source.CopyFrom(source)
        return out

    # --- deliveries (retried: same MessageId) -----------------------------------------------------------

    async def send(
        self,
        session: SessionLike,
        message: MessageLike,
        *,
        target: int = ev.TARGET_NEXT_TURN,
        wakeup: bool = True,
        id: str | None = None,
        source: ev.MessageSource | None = None,
    ) -> api.SendReply:
        """The delivery primitive (SPEC §2): ``target`` is ``TARGET_NEXT_TURN`` or ``TARGET_NEXT_STEP``."""
        request = api.SendRequest(
            session=self.ref(session), message=self.message(message, id=id, source=source), target=target, wakeup=wakeup
        )
        return await self._unary("Send", request, retry=True)

    async def _deliver(
        self, method: str, session: SessionLike, message: MessageLike, id, source, output_schema=None
    ) -> api.SendReply:
        request = api.DeliverRequest(session=self.ref(session), message=self.message(message, id=id, source=source))
        if output_schema is not None:
            request.output_schema.CopyFrom(_output_schema(output_schema))
        return await self._unary(method, request, retry=True)

    async def followup(
        self, session: SessionLike, message: MessageLike, *, id: str | None = None, source=None, output_schema=None
    ) -> api.SendReply:
        """next-turn, wakeup: a new turn; starts the agent if idle."""
        return await self._deliver("Followup", session, message, id, source, output_schema)

    async def queue(
        self, session: SessionLike, message: MessageLike, *, id: str | None = None, source=None, output_schema=None
    ) -> api.SendReply:
        """next-turn, no wakeup: a turn that waits for a later waking delivery."""
        return await self._deliver("Queue", session, message, id, source, output_schema)

    async def inject(
        self, session: SessionLike, message: MessageLike, *, id: str | None = None, source=None, output_schema=None
    ) -> api.SendReply:
        """next-step, no wakeup: model-visible context (default source ``plugin{""}``)."""
        return await self._deliver("Inject", session, message, id, source, output_schema)

    async def interrupt(
        self, session: SessionLike, message: MessageLike, *, id: str | None = None, source=None, output_schema=None
    ) -> api.SendReply:
        """Cancels the running turn keeping the inbox, then follows up with ``message`` at the head."""
        return await self._deliver("Interrupt", session, message, id, source, output_schema)

    async def steer(
        self,
        session: SessionLike,
        message: MessageLike,
        *,
        expected_turn: int | None = None,
        deadline_ms: int | None = None,
        on_deadline: int = ev.ON_DEADLINE_UNSPECIFIED,
        id: str | None = None,
        source: ev.MessageSource | None = None,
    ) -> api.SendReply:
        """next-step, wakeup: input for the running turn's next step (opens a turn when idle)."""
        request = api.SteerRequest(session=self.ref(session), message=self.message(message, id=id, source=source))
        if expected_turn is not None:
            request.expected_turn = expected_turn
        if deadline_ms is not None:
            request.deadline_ms = deadline_ms
        request.on_deadline = on_deadline
        return await self._unary("Steer", request, retry=True)

    # --- commands and edits (not retried) ---------------------------------------------------------------

    async def cancel(
        self, session: SessionLike, *, cause: ev.CancelCause | None = None, keep_inbox: bool = False
    ) -> api.CancelReply:
        """Cancels the running turn (cause ``user`` by default); ``keep_inbox`` keeps the pending messages."""
        request = api.CancelRequest(session=self.ref(session), keep_inbox=keep_inbox)
        if cause is not None:
            request.cause.CopyFrom(cause)
        return await self._unary("Cancel", request, retry=False)

    async def replace(self, session: SessionLike, id: str, message: MessageLike) -> api.EditReply:
        """Replaces pending message ``id`` (NOT_FOUND when it is not pending)."""
        request = api.ReplaceRequest(session=self.ref(session), id=id, message=self.message(message))
        return await self._unary("Replace", request, retry=False)

    async def remove(self, session: SessionLike, id: str) -> api.EditReply:
        """Removes pending message ``id`` (NOT_FOUND when it is not pending)."""
        return await self._unary("Remove", api.RemoveRequest(session=self.ref(session), id=id), retry=False)

    async def splice(
        self,
        session: SessionLike,
        target: int,
        start: int,
        delete_count: int,
        inserted: Sequence[MessageLike] = (),
    ) -> api.EditReply:
        request = api.SpliceRequest(
            session=self.ref(session),
            target=target,
            start=start,
            delete_count=delete_count,
            inserted=[self.message(m) for m in inserted],
        )
        return await self._unary("Splice", request, retry=False)

    async def clear(self, session: SessionLike) -> api.EditReply:
        return await self._unary("Clear", api.ClearRequest(session=self.ref(session)), retry=False)

    async def configure_session(
        self,
        session: SessionLike,
        agent: str,
        *,
        inject_mode: int = ev.INJECT_MODE_UNSPECIFIED,
        version: int = 0,
        system_prompt: str | None = None,
        model: str | None = None,
        tools: Sequence[str] | None = None,
    ) -> api.SessionInfo:
        """Sets the session's agent (at ``version``; 0: its newest, SPEC §20) and inject mode from the next turn,
        and its overrides, as far as the agent allows them (``[agents.NAME.overrides]``): ``system_prompt`` sent
        after the agent's, ``model`` from its list, ``tools`` a subset of its tools (``[]``: none). All of them at
        once: one left out is no override."""
        request = api.ConfigureSessionRequest(
            session=self.ref(session), agent=agent, inject_mode=inject_mode, version=version
        )
        if system_prompt is not None or model is not None or tools is not None:
            overrides = ev.SessionOverrides()
            if system_prompt is not None:
                overrides.system_prompt = system_prompt
            if model is not None:
                overrides.model = model
            if tools is not None:
                overrides.tools.CopyFrom(ev.ToolSubset(tools=list(tools)))
            request.overrides.CopyFrom(overrides)
        return await self._unary("ConfigureSession", request, retry=False)

    async def decide(self, session: SessionLike, call_id: str, approve: bool, reason: str = "") -> api.EditReply:
        """Approves or denies a tool call awaiting approval."""
        request = api.DecideRequest(session=self.ref(session), call_id=call_id, approve=approve, reason=reason)
        return await self._unary("Decide", request, retry=False)

    async def complete_tool_call(
        self, session: SessionLike, call_id: str, output: str, error: str | None = None
    ) -> api.EditReply:
        """Answers the call of a client tool of the turn (``tool/call {awaiting_client}``, SPEC §19) with its
        result: durable ``tool/result``, then the turn goes on. ``error`` marks the call failed."""
        request = api.CompleteToolCallRequest(session=self.ref(session), call_id=call_id, output=output)
        if error is not None:
            request.error = error
        return await self._unary("CompleteToolCall", request, retry=False)

    async def set_goal(self, session: SessionLike, objective: str, max_rounds: int) -> api.GoalInfo:
        request = api.SetGoalRequest(session=self.ref(session), objective=objective, max_rounds=max_rounds)
        return await self._unary("SetGoal", request, retry=False)

    async def update_goal(self, session: SessionLike, goal_id: str, action: int) -> api.GoalInfo:
        """``action``: ``GOAL_ACTION_PAUSE``, ``GOAL_ACTION_RESUME`` or ``GOAL_ACTION_CLEAR``."""
        request = api.UpdateGoalRequest(session=self.ref(session), goal_id=goal_id, action=action)
        return await self._unary("UpdateGoal", request, retry=False)

    # --- history operations (SPEC §13) and deletion (§12) --------------------------------------------------

    async def compact(self, session: SessionLike) -> api.EditReply:
        """Summarizes the session's finished turns not yet summarized (durable ``context/compacted``); only
        while idle. Nothing to summarize writes nothing and answers the last seq."""
        return await self._unary("Compact", api.CompactRequest(session=self.ref(session)), retry=False)

    async def fork_session(self, session: SessionLike, at_turn: int, new_session: str) -> api.SessionInfo:
        """Creates ``new_session`` (same tenant) from ``session``'s transcript through the end of ``at_turn``.
        Not retried: a repeat of a fork that landed answers ALREADY_EXISTS."""
        request = api.ForkSessionRequest(session=self.ref(session), at_turn=at_turn, new_session=new_session)
        return await self._unary("ForkSession", request, retry=False)

    async def reference_session(
        self, session: SessionLike, from_session: SessionLike, *, upto_turn: int | None = None, id: str | None = None
    ) -> api.SendReply:
        """Injects ``from_session``'s transcript (through ``upto_turn``, or all of it) into ``session`` as one
        message with a ``session`` source. A delivery: retried on UNAVAILABLE with the same MessageId."""
        request = api.ReferenceSessionRequest(
            session=self.ref(session), from_session=self.ref(from_session), message_id=id or str(uuid.uuid4())
        )
        if upto_turn is not None:
            request.upto_turn = upto_turn
        return await self._unary("ReferenceSession", request, retry=True)

    async def delete_session(self, session: SessionLike) -> api.EditReply:
        """Cancels a running turn (cause ``disposed``), then removes the session's log, snapshots and dedup
        state; the id may be used again. Not retried: a repeat of a delete that landed answers NOT_FOUND."""
        return await self._unary("DeleteSession", api.DeleteSessionRequest(session=self.ref(session)), retry=False)

    # --- reads (retried) --------------------------------------------------------------------------------

    async def get_inbox(self, session: SessionLike) -> api.InboxSnapshot:
        return await self._unary("GetInbox", api.GetInboxRequest(session=self.ref(session)), retry=True)

    async def get_session(self, session: SessionLike) -> api.SessionInfo:
        return await self._unary("GetSession", api.GetSessionRequest(session=self.ref(session)), retry=True)

    async def get_transcript(
        self, session: SessionLike, *, after_seq: int = 0, page_size: int = 0
    ) -> api.GetTranscriptReply:
        """One page of the session's transcript (SPEC §21): items with a seq above ``after_seq``, at most
        ``page_size`` (0: 100; at most 1000). ``next_seq`` is the next page's ``after_seq`` (0 at the end);
        ``last_seq`` is where a ``watch`` that follows the conversation starts. NOT_FOUND without events."""
        request = api.GetTranscriptRequest(session=self.ref(session), after_seq=after_seq, page_size=page_size)
        return await self._unary("GetTranscript", request, retry=True)

    async def transcript(
        self, session: SessionLike, *, after_seq: int = 0, page_size: int = 0
    ) -> AsyncIterator[api.TranscriptItem]:
        """The session's conversation, oldest first, page after page: user messages (with ``delivery`` and
        source), assistant messages, tool calls, decisions, results and turn ends with usage, each with the
        ``seq`` of its event."""
        while True:
            page = await self.get_transcript(session, after_seq=after_seq, page_size=page_size)
            for item in page.items:
                yield item
            if page.next_seq == 0:
                return
            after_seq = page.next_seq

    async def list_pending_approvals(
        self,
        session: SessionLike | None = None,
        *,
        tenant: str | None = None,
        page_token: str = "",
        page_size: int = 0,
    ) -> api.ListPendingApprovalsReply:
        """The approvals inbox (SPEC §21): the tool calls awaiting a decision, of ``session``, or of a page of
        the tenant's running sessions (``page_size`` sessions; follow ``next_page_token`` until it is empty,
        a page may hold no call)."""
        request = api.ListPendingApprovalsRequest(
            session=None if session is None else self.ref(session),
            tenant=self.tenant if tenant is None else tenant,
            page_token=page_token,
            page_size=page_size,
        )
        return await self._unary("ListPendingApprovals", request, retry=True)

    async def put_agent(self, name: str, definition: str | dict[str, Any]) -> api.AgentInfo:
        """Puts agent ``name`` of the caller's tenant (SPEC §20): ``definition`` holds the keys of an
        ``[agents.NAME]`` table, as TOML text or a dict (sent as JSON). A changed definition is a new version;
        a bad one is INVALID_ARGUMENT naming the key, as the configuration file would."""
        if isinstance(definition, dict):
            text, fmt = json.dumps(definition), api.DEFINITION_FORMAT_JSON
        else:
            text, fmt = definition, api.DEFINITION_FORMAT_UNSPECIFIED
        request = api.PutAgentRequest(name=name, definition=text, format=fmt)
        return await self._unary("PutAgent", request, retry=True)

    async def get_agent(self, name: str, *, version: int = 0) -> api.AgentInfo:
        """Agent ``name`` at ``version`` (0: its newest); NOT_FOUND for one the caller cannot see."""
        return await self._unary("GetAgent", api.GetAgentRequest(name=name, version=version), retry=True)

    async def list_agents(self) -> api.ListAgentsReply:
        """The agents the caller's sessions may run, newest versions."""
        return await self._unary("ListAgents", api.ListAgentsRequest(), retry=True)

    async def list_agent_versions(self, name: str) -> api.ListAgentVersionsReply:
        """Every version of agent ``name``, oldest first."""
        return await self._unary("ListAgentVersions", api.ListAgentVersionsRequest(name=name), retry=True)

    async def delete_agent(self, name: str) -> api.AgentInfo:
        """Deletes the caller's agent ``name``: no new session may use it; its sessions keep their version."""
        return await self._unary("DeleteAgent", api.DeleteAgentRequest(name=name), retry=False)

    async def migrate_sessions(
        self,
        agent: str,
        to_version: int = 0,
        *,
        sessions: Sequence[SessionLike] = (),
        label_selector: str = "",
    ) -> api.MigrateSessionsReply:
        """Moves the sessions running ``agent`` (``sessions``, or those ``label_selector`` selects) to
        ``to_version`` (0: the newest) from their next turn, durably."""
        request = api.MigrateSessionsRequest(
            agent=agent,
            to_version=to_version,
            sessions=[self.ref(s) for s in sessions],
            label_selector=label_selector,
        )
        return await self._unary("MigrateSessions", request, retry=True)

    async def put_memory(
        self, namespace: str, key: str, document: Any, *, tenant: str | None = None, raw: bool = False
    ) -> api.MemoryDocument:
        """Writes ``document`` (any JSON value; with ``raw``, a string holding JSON text) at ``key`` of
        ``namespace`` in the tenant's memory (SPEC §20), replacing what was there."""
        text = document if raw and isinstance(document, str) else json.dumps(document)
        request = api.PutMemoryRequest(
            tenant=self.tenant if tenant is None else tenant, namespace=namespace, key=key, document=text
        )
        return await self._unary("PutMemory", request, retry=True)

    async def get_memory(self, namespace: str, key: str, *, tenant: str | None = None) -> api.MemoryDocument:
        """The document at ``key`` of ``namespace`` (its JSON text in ``document``); NOT_FOUND when none."""
        request = api.GetMemoryRequest(tenant=self.tenant if tenant is None else tenant, namespace=namespace, key=key)
        return await self._unary("GetMemory", request, retry=True)

    async def list_memory(
        self,
        *,
        tenant: str | None = None,
        namespace: str = "",
        prefix: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> api.ListMemoryReply:
        """A page of the tenant's documents whose keys start with ``prefix``, in (namespace, key) order."""
        request = api.ListMemoryRequest(
            tenant=self.tenant if tenant is None else tenant,
            namespace=namespace,
            prefix=prefix,
            page_size=page_size,
            page_token=page_token,
        )
        return await self._unary("ListMemory", request, retry=True)

    async def search_memory(
        self, query: str, *, tenant: str | None = None, namespaces: Sequence[str] = (), limit: int = 0
    ) -> api.SearchMemoryReply:
        """The documents that best match the words of ``query`` (BM25), best first."""
        request = api.SearchMemoryRequest(
            tenant=self.tenant if tenant is None else tenant, namespaces=list(namespaces), query=query, limit=limit
        )
        return await self._unary("SearchMemory", request, retry=True)

    async def delete_memory(self, namespace: str, key: str, *, tenant: str | None = None) -> api.MemoryDocument:
        """Deletes the document at ``key`` of ``namespace`` and answers it; NOT_FOUND when there is none."""
        request = api.DeleteMemoryRequest(
            tenant=self.tenant if tenant is None else tenant, namespace=namespace, key=key
        )
        return await self._unary("DeleteMemory", request, retry=False)

    async def when_idle(self, session: SessionLike, *, timeout_ms: int = 0) -> api.SessionInfo:
        """Resolves when the session is idle with nothing latched; DEADLINE_EXCEEDED after ``timeout_ms``
        (0: the server's default, 30 s)."""
        request = api.WhenIdleRequest(session=self.ref(session), timeout_ms=timeout_ms)
        return await self._unary("WhenIdle", request, retry=True)

    async def list_sessions(
        self,
        *,
        page_token: str = "",
        page_size: int = 0,
        tenant: str | None = None,
        parent: str = "",
        status: int = ev.SESSION_STATUS_UNSPECIFIED,
        agent: str = "",
        agent_version: int = 0,
        label_selector: str = "",
        updated_after_unix_ms: int | None = None,
        updated_before_unix_ms: int | None = None,
        order_by: int = api.SESSION_ORDER_UNSPECIFIED,
    ) -> api.ListSessionsReply:
        """One page of the tenant's sessions; with ``parent``, only that session's children (``spawn_agent``).
        Filters (SPEC §16): ``status``, ``agent`` (and ``agent_version``, the version sessions recorded, SPEC §20;
        0: any), ``label_selector`` (``k=v,k!=v,k,!k``) and the last activity; ``order_by=SESSION_ORDER_LAST_ACTIVITY``
        lists the newest first."""
        request = api.ListSessionsRequest(
            page_token=page_token,
            page_size=page_size,
            tenant=self.tenant if tenant is None else tenant,
            parent=parent,
            status=status,
            agent=agent,
            agent_version=agent_version,
            label_selector=label_selector,
            order_by=order_by,
        )
        if updated_after_unix_ms is not None:
            request.updated_after_unix_ms = updated_after_unix_ms
        if updated_before_unix_ms is not None:
            request.updated_before_unix_ms = updated_before_unix_ms
        return await self._unary("ListSessions", request, retry=True)

    async def get_usage(self, *, tenant: str | None = None, since_unix_ms: int = 0) -> api.TenantUsage:
        """The tenant's model tokens per model from the UTC day of ``since_unix_ms`` on (0: every day kept),
        counted cluster-wide from the durable ``assistant/message`` usages, with its daily token budget, the
        tokens used today and when that count resets (SPEC §17)."""
        request = api.GetUsageRequest(tenant=self.tenant if tenant is None else tenant, since_unix_ms=since_unix_ms)
        return await self._unary("GetUsage", request, retry=True)

    # --- schedules (SPEC §15) and labels (§16) -----------------------------------------------------------

    async def create_schedule(
        self,
        session: SessionLike,
        schedule_id: str,
        message: MessageLike,
        *,
        at_unix_ms: int | None = None,
        cron: str | None = None,
        time_zone: str = "",
        preset: int = ev.SCHEDULE_PRESET_FOLLOWUP,
        not_after_unix_ms: int | None = None,
        catchup_ms: int = 0,
    ) -> api.Schedule:
        """Stores a schedule: once at ``at_unix_ms``, or by the 5-field ``cron`` pattern in ``time_zone``
        (default UTC). Each firing delivers ``message`` with ``preset`` and MessageId
        ``<schedule_id>@<fire_unix_ms>``. Retried on UNAVAILABLE: the same schedule again is not a new one."""
        if (at_unix_ms is None) == (cron is None):
            raise ValueError("give exactly one of at_unix_ms and cron")
        body = self.message(message, id="")
        request = api.CreateScheduleRequest(
            session=self.ref(session),
            schedule_id=schedule_id,
            preset=preset,
            message=ev.UserMessage(content=body.content),
            time_zone=time_zone,
            catchup_ms=catchup_ms,
        )
        if at_unix_ms is not None:
            request.at_unix_ms = at_unix_ms
        else:
            request.cron = cron
        if not_after_unix_ms is not None:
            request.not_after_unix_ms = not_after_unix_ms
        return await self._unary("CreateSchedule", request, retry=True)

    async def list_schedules(
        self, session: SessionLike | None = None, *, page_token: str = "", page_size: int = 0
    ) -> api.ListSchedulesReply:
        """The schedules of ``session``, or one page of those of every session of the tenant."""
        request = api.ListSchedulesRequest(page_token=page_token, page_size=page_size, tenant=self.tenant)
        if session is not None:
            request.session.CopyFrom(self.ref(session))
        return await self._unary("ListSchedules", request, retry=True)

    async def delete_schedule(self, session: SessionLike, schedule_id: str) -> api.Schedule:
        """Deletes a schedule; NOT_FOUND when the session has none by that id (a one-shot that fired is gone).
        Not retried: a repeat of a delete that landed answers NOT_FOUND."""
        request = api.DeleteScheduleRequest(session=self.ref(session), schedule_id=schedule_id)
        return await self._unary("DeleteSchedule", request, retry=False)

    async def set_labels(
        self, session: SessionLike, labels: dict[str, str] | None = None, *, remove: Sequence[str] = ()
    ) -> api.SessionInfo:
        """Sets ``labels`` and removes the keys in ``remove`` (durable ``session/labeled``)."""
        request = api.SetLabelsRequest(session=self.ref(session), labels=labels or {}, remove_keys=list(remove))
        return await self._unary("SetLabels", request, retry=True)

    async def sessions(self, **filters: Any) -> AsyncIterator[api.SessionInfo]:
        """Every session of the tenant (or every child of ``parent``) that passes the filters, page after
        page: the keyword arguments of :meth:`list_sessions` but ``page_token`` (``label_selector``,
        ``status``, ``agent``, ``updated_after_unix_ms``, ``order_by``, ...)."""
        if "page_token" in filters:
            raise TypeError("sessions() pages by itself; use list_sessions(page_token=...) for one page")
        token = ""
        while True:
            page = await self.list_sessions(page_token=token, **filters)
            for info in page.sessions:
                yield info
            token = page.next_page_token
            if not token:
                return

    # --- webhooks (SPEC §21) ---------------------------------------------------------------------------

    async def create_webhook(
        self,
        url: str,
        *,
        events: Sequence[str] = ("turn/end",),
        label_selector: str = "",
        max_age_ms: int = 0,
        tenant: str | None = None,
    ) -> api.Webhook:
        """Registers a webhook for the tenant: the owner of each of its sessions whose labels match POSTs
        their durable events of ``events`` types written from now on to ``url``, signed with the reply's
        ``secret`` (shown only here). INVALID_ARGUMENT for an internal address unless the server allows it.
        Not retried: a repeat would register a second webhook."""
        request = api.CreateWebhookRequest(
            tenant=self.tenant if tenant is None else tenant,
            url=url,
            events=list(events),
            label_selector=label_selector,
            max_age_ms=max_age_ms,
        )
        return await self._unary("CreateWebhook", request, retry=False)

    async def list_webhooks(self, *, tenant: str | None = None) -> api.ListWebhooksReply:
        """The tenant's webhooks, oldest first, without their secrets."""
        request = api.ListWebhooksRequest(tenant=self.tenant if tenant is None else tenant)
        return await self._unary("ListWebhooks", request, retry=True)

    async def delete_webhook(self, id: str, *, tenant: str | None = None) -> api.Webhook:
        """Deletes webhook ``id``: no POST starts after it. NOT_FOUND for an id the tenant does not have."""
        request = api.DeleteWebhookRequest(tenant=self.tenant if tenant is None else tenant, id=id)
        return await self._unary("DeleteWebhook", request, retry=False)

    # --- export and import (SPEC §18; admin only with auth) -----------------------------------------------

    async def evaluate(
        self,
        agent: str,
        *,
        version: int = 0,
        sessions: Sequence[SessionLike] = (),
        label_selector: str = "",
        first_turn: int = 0,
        last_turn: int = 0,
        scorer: api.EvalScorer | None = None,
        parallel: int = 0,
        max_turns: int = 0,
        turn_timeout_ms: int = 0,
        tenant: str | None = None,
    ) -> AsyncIterator[api.EvaluateItem]:
        """Reruns recorded turns (of ``sessions``, else those ``label_selector`` selects; turns ``first_turn``
        to ``last_turn``, 0 meaning open) on ``agent`` at ``version`` in scratch sessions and scores each
        new reply beside its recording (``scorer``, default exact): yields ``started``, one ``row`` per turn
        as it finishes, then ``summary`` (SPEC §20). Closing the iteration stops the run; its scratch
        sessions are deleted either way. Not retried: a second run would rerun every turn again."""
        request = api.EvaluateRequest(
            tenant=self.tenant if tenant is None else tenant,
            sessions=[self.ref(s) for s in sessions],
            label_selector=label_selector,
            first_turn=first_turn,
            last_turn=last_turn,
            agent=agent,
            version=version,
            scorer=scorer,
            parallel=parallel,
            max_turns=max_turns,
            turn_timeout_ms=turn_timeout_ms,
        )
        call = self.stub.Evaluate(request, metadata=self._metadata)
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as e:
            raise TurnstileError("Evaluate", e.code(), e.details() or "") from e
        finally:
            call.cancel()

    async def export_sessions(
        self, sessions: Sequence[str] = (), *, tenant: str | None = None
    ) -> AsyncIterator[api.ExportItem]:
        """The whole logs of ``sessions`` of the tenant (all of them when empty) as ``ExportItem``s. Opening
        the stream is retried on UNAVAILABLE until its first item; a stream that breaks later raises."""
        request = api.ExportSessionsRequest(tenant=self.tenant if tenant is None else tenant, sessions=list(sessions))
        retries = _Retries(self._reconnect, self.retry, "ExportSessions")
        while True:
            received = False
            call = self.stub.ExportSessions(request, metadata=self._metadata)
            try:
                async for item in call:
                    received = True
                    yield item
                return
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or received:
                    raise TurnstileError("ExportSessions", e.code(), e.details() or "") from e
                details = e.details() or ""
            finally:
                call.cancel()
            await retries.after_unavailable(details)

    async def import_sessions(
        self, items: AsyncIterable[api.ExportItem] | Iterable[api.ExportItem]
    ) -> api.ImportReply:
        """Writes an export (``export_sessions``' items) into this deployment keeping every seq, time and
        MessageId. Not retried: the items are consumed."""

        async def stream() -> AsyncIterator[api.ExportItem]:
            if isinstance(items, AsyncIterable):
                async for item in items:
                    yield item
            else:
                for item in items:
                    yield item

        try:
            return await self.stub.ImportSessions(stream(), metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise TurnstileError("ImportSessions", e.code(), e.details() or "") from e

    # --- high-level helpers -------------------------------------------------------------------------------

    async def run(
        self,
        session: SessionLike,
        message: MessageLike,
        *,
        preset: str = "followup",
        timeout: float | None = None,
        id: str | None = None,
        source: ev.MessageSource | None = None,
    ) -> RunResult:
        """Sends ``message`` (``preset``: ``"followup"``, ``"steer"`` or ``"interrupt"``), waits for the turn
        it runs in to end (at most ``timeout`` seconds: then DEADLINE_EXCEEDED) and answers what that turn
        produced: its number, the reply ``text`` (the turn's last model message), every model message, the
        tool calls with their decisions and results, the tokens and how it ended (``reason``)."""
        msg = self.message(message, id=id, source=source)
        delivered = {"followup": self.followup, "steer": self.steer, "interrupt": self.interrupt}.get(preset)
        if delivered is None:
            raise ValueError(f"preset {preset!r}: use 'followup', 'steer' or 'interrupt'")
        reply = await delivered(session, msg)

        async def ended() -> RunResult:
            folder, turn = EventFolder(), None
            stream = self.watch(session, after_seq=reply.seq - 1, live=False)
            try:
                async for item in stream:
                    for event in folder.fold(item):
                        if turn is None and event.type == "user" and event.id == msg.id and event.turn > 0:
                            turn = RunFolder(event.turn)
                        if turn is not None:
                            turn.add(event)
                            if turn.result is not None:
                                return turn.result
            finally:
                await stream.aclose()
            raise AssertionError("a Watch never ends by itself")

        try:
            return await asyncio.wait_for(ended(), timeout)
        except asyncio.TimeoutError as e:
            raise TurnstileError("Run", grpc.StatusCode.DEADLINE_EXCEEDED, f"the turn did not end within {timeout} s") from e

    async def turn_of(self, session: SessionLike, message_id: str, *, after_seq: int = 0) -> int:
        """The turn the delivered message ``message_id`` runs in, once it has entered one (0: it entered
        history between turns). ``reply.turn`` says it at once for a delivery that opened a turn; a steer
        into a running turn, an interrupt or a queued followup learn it here:
        ``reply.turn if reply.HasField("turn") else await c.turn_of(s, id, after_seq=reply.seq)``."""
        folder = EventFolder()
        stream = self.watch(session, after_seq=max(after_seq - 1, 0), live=False)
        try:
            async for item in stream:
                for event in folder.fold(item):
                    if event.type == "user" and event.id == message_id:
                        return event.turn
        finally:
            await stream.aclose()
        raise AssertionError("a Watch never ends by itself")

    async def events(self, session: SessionLike, **watch: Any) -> AsyncIterator[TurnEvent]:
        """The session's typed events (``user``, ``text_delta``, ``message``, ``tool_started``,
        ``approval``, ``tool_decided``, ``tool_done``, ``turn_started``, ``turn_done``, ``caught_up``; see
        ``turnstile_client.events``), read from :meth:`watch` with the same keyword arguments."""
        folder = EventFolder()
        stream = self.watch(session, **watch)
        try:
            async for item in stream:
                for event in folder.fold(item):
                    yield event
        finally:
            await stream.aclose()

    # --- streams ----------------------------------------------------------------------------------------

    def watch(
        self,
        session: SessionLike,
        *,
        after_seq: int = 0,
        live: bool = True,
        resume: bool = True,
        from_: WatchPosition | None = None,
    ) -> WatchStream:
        """The session's ``WatchItem``s: durable ``event``s after ``after_seq``, ``caught_up``, then the
        live tail (``live`` events and new ``event``s).

        After a disconnect (UNAVAILABLE: a gateway restarting or gone) the stream is opened again, at the
        address asked anew, from the last durable seq received, so no durable event is missed or repeated;
        a resumed stream sends a fresh ``caught_up``. A reply that was streaming goes on where the caller
        was: the reopened stream asks for the step's output after the byte offsets of the deltas already
        yielded (``resume``, SPEC §14), so across the disconnect each byte of the reply is yielded once, at
        contiguous offsets (if the step ended meanwhile, its durable ``assistant/message`` follows instead).
        Other live events of the gap are not replayed: they are not stored (SPEC §5). Retries follow
        ``retry``; with ``resume=False`` a disconnect raises.

        The stream's ``position`` is where it would reopen; ``from_`` starts where another stream stood (its
        ``position``, saved across a restart, say): after its seq, with the rest of its streaming step only.
        """
        state: dict[str, Any] = {
            "after_seq": from_.after_seq if from_ is not None else after_seq,
            "streaming": _StreamingStep.of(from_.streaming if from_ is not None else None),
        }
        return WatchStream(self._watch(self.ref(session), live, resume, state), state)

    async def _watch(
        self, ref: ev.SessionRef, live: bool, resume: bool, state: dict[str, Any]
    ) -> AsyncIterator[api.WatchItem]:
        """The loop behind :meth:`watch`; ``state`` holds its position."""
        streaming: _StreamingStep = state["streaming"]
        retries = _Retries(self._reconnect, self.retry if resume else NO_RETRY, "Watch")
        while True:
            request = api.WatchRequest(session=ref, after_seq=state["after_seq"], live=live, resume=streaming.resume())
            call = self.stub.Watch(request, metadata=self._metadata)
            try:
                async for item in call:
                    kind = item.WhichOneof("item")
                    if kind == "event":
                        state["after_seq"] = max(state["after_seq"], item.event.seq)
                    elif kind == "caught_up":
                        state["after_seq"] = max(state["after_seq"], item.caught_up.seq)
                    streaming.advance(item)
                    retries.succeeded()
                    yield item
                # The server never ends a Watch by itself; an end without an error is a lost connection.
                details = "the Watch stream ended"
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise TurnstileError("Watch", e.code(), e.details() or "") from e
                details = e.details() or ""
            finally:
                call.cancel()
            await retries.after_unavailable(details)

    def serve_tools(self, tools: Tools) -> ToolServer:
        """A :class:`~turnstile_client.ToolServer` serving ``tools`` (a :class:`~turnstile_client.Tools`)
        through this client: ``await client.serve_tools(tools).run()`` serves until cancelled;
        ``async with client.serve_tools(tools):`` serves inside the block, registered on entry."""
        return ToolServer(self, tools)

    def _tool_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._metadata:
            return self._metadata
        return ((TENANT_HEADER, self.tenant),)
