"""Python client of Turnstile (package ``turnstile-client``): the ``turnstile.v1.Agent`` gRPC API with
typed helpers, automatic MessageIds, retries on UNAVAILABLE that repeat the same MessageId (SPEC §2 makes
them safe), a ``watch()`` that resumes from the last seq after a disconnect, and client tools served from
decorated Python functions, ``run()`` (send, wait for the turn, get its reply, tool calls and usage) and
typed events (``events()``, the classes of ``turnstile_client.events``).

The protobuf modules are generated from the repository's protos when the package builds
(``protogen.py``); they are re-exported as ``turnstile_client.pb`` (messages of ``agent.proto`` and
``events.proto``)."""

from . import _events as events
from ._client import Address, AsyncClient, WatchPosition, WatchStream, text_message, text_of
from ._events import RunResult, RunToolCall, TokenUsage, TurnEvent
from ._proto.turnstile.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from ._retry import RetryPolicy, TurnstileError
from ._sync import Client
from ._tools import ToolContext, ToolOutput, Tools, ToolServer


class _Pb:
    """Every message and enum value of turnstile.v1 in one namespace: ``pb.SessionRef``, ``pb.TARGET_NEXT_STEP``."""

    def __init__(self) -> None:
        for module in (events_pb2, agent_pb2):
            for name in dir(module):
                if not name.startswith("_"):
                    setattr(self, name, getattr(module, name))


pb = _Pb()

__all__ = [
    "Address",
    "AsyncClient",
    "Client",
    "RetryPolicy",
    "RunResult",
    "RunToolCall",
    "TokenUsage",
    "ToolContext",
    "ToolOutput",
    "ToolServer",
    "Tools",
    "TurnEvent",
    "TurnstileError",
    "WatchPosition",
    "WatchStream",
    "agent_pb2",
    "agent_pb2_grpc",
    "events",
    "events_pb2",
    "pb",
    "text_message",
    "text_of",
]
