"""A chat app on the Python client (issue 41): it renders a session's history from its transcript
(GetTranscript), sends each line of stdin as a followup and streams the reply with typed events, and
answers the tool calls waiting for approval from the approvals inbox (ListPendingApprovals, Decide).

    python examples/chat.py SESSION [--agent NAME] [--deny] < lines    # TURNSTILE_ADDR=host:port, TURNSTILE_TOKEN=...

``--agent`` configures a new session to run agent NAME; ``--deny`` denies the calls waiting for approval
(the default approves them). Every line it prints is one of: ``you: TEXT``, ``assistant: TEXT`` (streamed),
``tool NAME(ARGS)``, ``approval: NAME(ARGS) approved|denied``, ``  -> OUTPUT``, ``[turn N REASON]``; the
history uses the same, so a session's history prints what its chats printed. The twin of the TypeScript
client's ``examples/chat.mjs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

import grpc

from turnstile_client import AsyncClient, TurnstileError, text_of


class Chat:
    def __init__(self, client: AsyncClient, session: str, approve: bool):
        self.client, self.session, self.approve = client, session, approve
        #: The calls that waited for approval, by call id, so that their decision names them.
        self.waited: dict[str, str] = {}

    def history_line(self, item) -> str | None:
        kind = item.WhichOneof("item")
        if kind == "user":
            return f"you: {text_of(item.user.message)}"
        if kind == "assistant":
            return f"assistant: {item.assistant.text}" if item.assistant.text else None
        if kind == "tool_call":
            call = item.tool_call
            if not call.awaiting_approval:
                return f"tool {call.name}({call.arguments})"
            self.waited[call.call_id] = f"{call.name}({call.arguments})"
            return None
        if kind == "tool_decision":
            d = item.tool_decision
            return f"approval: {self.waited.get(d.call_id)} {'approved' if d.approved else 'denied'}"
        if kind == "tool_result":
            r = item.tool_result
            return f"  -> {r.error if r.HasField('error') else r.output}"
        if kind == "turn_end":
            return f"[turn {item.turn} {item.turn_end.reason.WhichOneof('reason') or 'ended'}]"
        return None

    async def history(self, agent: str | None) -> int:
        """Prints the session's history, page after page; answers the seq to follow on from."""
        after_seq = 0
        while True:
            try:
                page = await self.client.get_transcript(self.session, after_seq=after_seq)
            except TurnstileError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise
                print("(a new session)")
                # Its first event: the agent it runs.
                return (await self.client.configure_session(self.session, agent)).last_seq if agent else 0
            for item in page.items:
                line = self.history_line(item)
                if line is not None:
                    print(line)
            if page.next_seq == 0:
                return page.last_seq
            after_seq = page.next_seq

    async def answer_approvals(self) -> None:
        """Decides every call the session's approvals inbox lists."""
        for a in (await self.client.list_pending_approvals(self.session)).approvals:
            reason = "approved in chat" if self.approve else "denied in chat"
            await self.client.decide(self.session, a.call_id, self.approve, reason)
            print(f"approval: {a.tool}({a.arguments}) {'approved' if self.approve else 'denied'}")

    async def run(self, agent: str | None, lines: list[str]) -> None:
        events = self.client.events(self.session, after_seq=await self.history(agent))
        await anext(events)  # caught_up: the stream is open before the first line is sent
        for text in lines:
            if not text.strip():
                continue
            message_id = str(uuid.uuid4())
            await self.client.followup(self.session, text, id=message_id)
            print(f"you: {text}")
            turn, streaming = None, False  # the turn this line runs in: known once its message entered one
            while True:
                event = await anext(events)
                if event.type == "user" and event.id == message_id:
                    turn = event.turn
                if turn is None or getattr(event, "turn", None) != turn:
                    continue
                if event.type == "text_delta" and not event.reasoning:
                    print(("" if streaming else "assistant: ") + event.text, end="", flush=True)
                    streaming = True
                elif event.type == "message":
                    if streaming:
                        print()
                    elif event.text:
                        print(f"assistant: {event.text}")
                    streaming = False
                elif event.type == "tool_started":
                    print(f"tool {event.name}({event.arguments})")
                elif event.type == "approval":
                    await self.answer_approvals()
                elif event.type == "tool_done":
                    print(f"  -> {event.error if event.error is not None else event.output}")
                elif event.type == "turn_done":
                    print(f"[turn {event.turn} {event.reason}]")
                    break
        await events.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("session")
    parser.add_argument("--agent")
    parser.add_argument("--deny", action="store_true")
    args = parser.parse_args()
    address = os.environ.get("TURNSTILE_ADDR", "127.0.0.1:7400")
    async with AsyncClient(address, token=os.environ.get("TURNSTILE_TOKEN")) as client:
        await Chat(client, args.session, not args.deny).run(args.agent, sys.stdin.read().splitlines())


if __name__ == "__main__":
    asyncio.run(main())
