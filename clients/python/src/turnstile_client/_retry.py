"""Errors and retries: what a refused call raises, and how calls and streams retry after UNAVAILABLE.
Shared by the client (``_client``) and the tool server (``_tools``), so neither imports the other's
internals."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc


class TurnstileError(Exception):
    """A call the server (or the transport) refused: ``code`` is the gRPC status code, ``details`` the
    server's message, which says what was wrong and what to do."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class RetryPolicy:
    """How calls that are safe to repeat are retried on UNAVAILABLE.

    Safe are the deliveries (``send``, ``followup``, ``queue``, ``steer``, ``inject``, ``interrupt``: the
    retry carries the same MessageId, which the session recognises and answers with the original
    acceptance, SPEC §2) and the reads. Edits, cancels, decisions and goal changes are not retried: a
    repeat after a lost reply could act twice. Backoff is exponential with jitter, until ``deadline``
    seconds have passed since the first attempt.
    """

    deadline: float = 30.0
    initial_backoff: float = 0.05
    max_backoff: float = 1.0

    def backoff(self, attempt: int) -> float:
        return min(self.max_backoff, self.initial_backoff * (2**attempt)) * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(deadline=0.0)


class _Retries:
    """The attempts after UNAVAILABLE of one call or stream: backoff by `policy`, the deadline counted from
    the first failure since the last success (`succeeded`)."""

    def __init__(self, reconnect: Callable[[], Awaitable[None]], policy: RetryPolicy, method: str):
        self.reconnect, self.policy, self.method = reconnect, policy, method
        self.attempt = 0
        self.failing_since: float | None = None

    def succeeded(self) -> None:
        self.attempt, self.failing_since = 0, None

    async def after_unavailable(self, details: str) -> None:
        """Waits out the backoff and re-resolves the address, or raises UNAVAILABLE past the deadline."""
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        pause = self.policy.backoff(self.attempt)
        if time.monotonic() + pause - self.failing_since > self.policy.deadline:
            raise TurnstileError(self.method, grpc.StatusCode.UNAVAILABLE, details)
        self.attempt += 1
        await asyncio.sleep(pause)
        await self.reconnect()
