"""Typed events (SPEC §21, issue 41): what an application renders, read from a session's Watch, and the
``run()`` result folded from them. The twins of the TypeScript client's ``TurnEvent`` and ``RunResult``."""

from __future__ import annotations

from dataclasses import dataclass

from ._proto.turnstile.v1 import agent_pb2 as api
from ._proto.turnstile.v1 import events_pb2 as ev


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True)
class UserEvent:
    """A user message entered a turn (or history between turns: ``turn`` 0)."""

    seq: int
    turn: int
    step: int
    id: str
    text: str
    message: ev.UserMessage
    type: str = "user"


@dataclass(frozen=True)
class TextDeltaEvent:
    """A piece of a reply (or of its reasoning) as the model writes it: live, not stored."""

    turn: int
    step: int
    text: str
    reasoning: bool
    type: str = "text_delta"


@dataclass(frozen=True)
class MessageEvent:
    """A model step's whole reply, durable (its deltas concatenate to ``text``)."""

    seq: int
    turn: int
    step: int
    text: str
    usage: TokenUsage
    type: str = "message"


@dataclass(frozen=True)
class ToolStartedEvent:
    """A tool call started (one that waits for a decision is an :class:`ApprovalEvent` instead)."""

    seq: int
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str
    type: str = "tool_started"


@dataclass(frozen=True)
class ApprovalEvent:
    """A tool call waits for ``decide(session, call_id, approve)`` (it is in ``list_pending_approvals``)."""

    seq: int
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str
    type: str = "approval"


@dataclass(frozen=True)
class ToolDecidedEvent:
    """A decision on a call that waited: by a person, or by its deadline (``timed_out``)."""

    seq: int
    turn: int
    step: int
    call_id: str
    approved: bool
    reason: str
    timed_out: bool
    type: str = "tool_decided"


@dataclass(frozen=True)
class ToolDoneEvent:
    """A tool call's result: ``output``, or ``error`` when it failed."""

    seq: int
    turn: int
    step: int
    call_id: str
    output: str
    error: str | None
    type: str = "tool_done"


@dataclass(frozen=True)
class TurnStartedEvent:
    seq: int
    turn: int
    type: str = "turn_started"


@dataclass(frozen=True)
class TurnDoneEvent:
    """A turn ended: ``reason`` is ``completed``, ``blocked``, ``max_tokens``, ``aborted``, ``error`` or
    ``interrupted``; ``usage`` sums the turn's model requests this stream saw."""

    seq: int
    turn: int
    reason: str
    detail: str
    usage: TokenUsage
    type: str = "turn_done"


@dataclass(frozen=True)
class CaughtUpEvent:
    """The stream has read the stored history: what follows is new."""

    seq: int
    status: int
    type: str = "caught_up"


TurnEvent = (
    UserEvent
    | TextDeltaEvent
    | MessageEvent
    | ToolStartedEvent
    | ApprovalEvent
    | ToolDecidedEvent
    | ToolDoneEvent
    | TurnStartedEvent
    | TurnDoneEvent
    | CaughtUpEvent
)


@dataclass
class RunToolCall:
    """A tool call of a :class:`RunResult`: what was asked, decided and answered."""

    call_id: str
    name: str
    arguments: str
    awaited_approval: bool
    approved: bool | None = None
    output: str | None = None
    error: str | None = None


@dataclass
class RunResult:
    """What ``run()`` answers: the turn the message ran in and what it produced."""

    turn: int
    #: The reply: the turn's last model message.
    text: str
    messages: list[str]
    tool_calls: list[RunToolCall]
    usage: TokenUsage
    reason: str
    detail: str
    #: The seq of its ``turn/end``.
    seq: int


def _reason(end: ev.TurnEndReason) -> tuple[str, str]:
    case = end.WhichOneof("reason")
    if case is None:
        return "unknown", ""
    detail = ""
    if case == "blocked":
        detail = end.blocked.reason
    elif case == "error":
        detail = end.error.message
    elif case == "aborted":
        detail = end.aborted.WhichOneof("cause") or ""
    return case, detail


def text_of(message: ev.UserMessage) -> str:
    """The message's text blocks, joined by newlines."""
    return "\n".join(b.text.text for b in message.content if b.WhichOneof("block") == "text")


class EventFolder:
    """Turns Watch items into typed events; keeps each open turn's usage so that ``turn_done`` carries it."""

    def __init__(self) -> None:
        self._usage: dict[int, TokenUsage] = {}

    def fold(self, item: api.WatchItem) -> list[TurnEvent]:
        kind = item.WhichOneof("item")
        if kind == "caught_up":
            return [CaughtUpEvent(seq=item.caught_up.seq, status=item.caught_up.status)]
        if kind == "live":
            if item.live.WhichOneof("payload") != "assistant_delta":
                return []
            d = item.live.assistant_delta
            return [TextDeltaEvent(turn=d.turn, step=d.step, text=d.text, reasoning=d.reasoning)]
        if kind != "event":
            return []
        e = item.event
        seq = e.seq
        payload = e.WhichOneof("payload")
        if payload == "user_message":
            m = e.user_message
            return [UserEvent(seq, m.turn, m.step, m.message.id, text_of(m.message), m.message)]
        if payload == "assistant_message":
            a = e.assistant_message
            usage = TokenUsage(a.usage.input_tokens, a.usage.output_tokens)
            self._usage[a.turn] = self._usage.get(a.turn, TokenUsage()) + usage
            return [MessageEvent(seq, a.turn, a.step, a.text, usage)]
        if payload == "tool_call":
            c = e.tool_call
            kind_ = ApprovalEvent if c.awaiting_approval else ToolStartedEvent
            return [kind_(seq, c.turn, c.step, c.call_id, c.name, c.arguments)]
        if payload == "tool_decision":
            d = e.tool_decision
            return [ToolDecidedEvent(seq, d.turn, d.step, d.call_id, d.approved, d.reason, d.timed_out)]
        if payload == "tool_result":
            r = e.tool_result
            error = r.error if r.HasField("error") else None
            return [ToolDoneEvent(seq, r.turn, r.step, r.call_id, r.output, error)]
        if payload == "turn_start":
            self._usage[e.turn_start.turn] = TokenUsage()
            return [TurnStartedEvent(seq, e.turn_start.turn)]
        if payload == "turn_end":
            turn = e.turn_end.turn
            reason, detail = _reason(e.turn_end.reason)
            return [TurnDoneEvent(seq, turn, reason, detail, self._usage.pop(turn, TokenUsage()))]
        return []


class RunFolder:
    """Folds the events of one turn into a :class:`RunResult` (``result`` once the turn ended)."""

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self._messages: list[str] = []
        self._calls: dict[str, RunToolCall] = {}
        self.result: RunResult | None = None

    def add(self, event: TurnEvent) -> None:
        if getattr(event, "turn", None) != self.turn:
            return
        if isinstance(event, MessageEvent):
            self._messages.append(event.text)
        elif isinstance(event, (ToolStartedEvent, ApprovalEvent)):
            self._calls[event.call_id] = RunToolCall(
                event.call_id, event.name, event.arguments, awaited_approval=isinstance(event, ApprovalEvent)
            )
        elif isinstance(event, ToolDecidedEvent) and event.call_id in self._calls:
            self._calls[event.call_id].approved = event.approved
        elif isinstance(event, ToolDoneEvent) and event.call_id in self._calls:
            self._calls[event.call_id].output = event.output
            self._calls[event.call_id].error = event.error
        elif isinstance(event, TurnDoneEvent):
            self.result = RunResult(
                turn=self.turn,
                text=self._messages[-1] if self._messages else "",
                messages=self._messages,
                tool_calls=list(self._calls.values()),
                usage=event.usage,
                reason=event.reason,
                detail=event.detail,
                seq=event.seq,
            )


__all__ = [
    "ApprovalEvent",
    "CaughtUpEvent",
    "EventFolder",
    "MessageEvent",
    "RunFolder",
    "RunResult",
    "RunToolCall",
    "TextDeltaEvent",
    "TokenUsage",
    "ToolDecidedEvent",
    "ToolDoneEvent",
    "ToolStartedEvent",
    "TurnDoneEvent",
    "TurnEvent",
    "TurnStartedEvent",
    "UserEvent",
    "text_of",
]
