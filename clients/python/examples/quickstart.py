"""Quickstart: follow up on a session of a running `turnstile dev` and print the reply as it streams.

    turnstile dev &                      # gateway + worker on 127.0.0.1:7400
    python examples/quickstart.py "hello there"    # TURNSTILE_ADDR=host:port for another server
"""

import asyncio
import os
import sys
import uuid

from turnstile_client import AsyncClient, pb


async def main(text: str, address: str) -> None:
    async with AsyncClient(address) as client:
        session = "quickstart-" + uuid.uuid4().hex[:8]
        stream = client.watch(session)
        await anext(stream)  # caught_up {seq: 0}: the stream is open before the first event
        reply = await client.followup(session, text)
        print(f"accepted at seq {reply.seq}, turn {reply.turn}")
        async for item in stream:
            kind = item.WhichOneof("item")
            if kind == "live" and item.live.WhichOneof("payload") == "assistant_delta":
                print(item.live.assistant_delta.text, end="", flush=True)
            elif kind == "event" and item.event.WhichOneof("payload") == "turn_end":
                print(f"\nturn {item.event.turn_end.turn} ended: {item.event.turn_end.reason.WhichOneof('reason')}")
                break
        info = await client.get_session(session)
        print(f"session {session}: {pb.SessionStatus.Name(info.status)}, last seq {info.last_seq}")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "hello", os.environ.get("TURNSTILE_ADDR", "127.0.0.1:7400")))
