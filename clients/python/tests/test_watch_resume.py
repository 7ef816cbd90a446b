"""A Watch resumed across a restarted gateway: `turnstile dev --nats` is stopped (SIGTERM: its Watch streams
end UNAVAILABLE) or killed (SIGKILL: the connection drops), a new one starts on the same NATS on a port of
its own, and the client, whose address provider now names the new one, reopens the stream from the last
seq it received: every durable event arrives once, in order, with no gap. The same on the embedded
journal with `--data-dir`, where the session survives on disk."""

from __future__ import annotations

import asyncio
import tempfile
import unittest
import uuid
from pathlib import Path

from harness import DevServer, NatsServer, bounded
from turnstile_client import AsyncClient, RetryPolicy, pb


async def events_until_reply(stream, reply_text: str, seen: list) -> None:
    """Appends the stream's durable events to `seen` until the idle status after the reply `reply_text`."""
    replied = False
    async for item in stream:
        if item.WhichOneof("item") != "event":
            continue
        e = item.event
        seen.append(e)
        if e.WhichOneof("payload") == "assistant_message" and e.assistant_message.text == reply_text:
            replied = True
        if replied and e.WhichOneof("payload") == "status" and e.status.status == pb.SESSION_STATUS_IDLE:
            return
    raise AssertionError("the Watch ended")


class WatchResume(unittest.IsolatedAsyncioTestCase):
    async def resume_across(self, start, restart) -> None:
        current = await asyncio.to_thread(start)
        try:
            address = lambda: current.address  # noqa: E731  (the provider the client asks after a disconnect)
            async with AsyncClient(address, retry=RetryPolicy(deadline=60.0)) as c:
                s = "py-" + uuid.uuid4().hex[:12]
                stream = c.watch(s)
                seen: list = []
                await c.followup(s, "one")
                await bounded(events_until_reply(stream, "echo: one", seen), "the first reply")
                first_address = current.address
                current = await asyncio.to_thread(restart, current)
                self.assertNotEqual(current.address, "", "the new server reported its address")
                # The stream notices the old server gone, reconnects to the new one and goes on; the
                # followup is retried the same way if it meets the gap.
                await c.followup(s, "two")
                await bounded(events_until_reply(stream, "echo: two", seen), "the reply after the restart")
                await stream.aclose()
                seqs = [e.seq for e in seen]
                self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "every durable event once, in order")
                replies = [e.assistant_message.text for e in seen if e.WhichOneof("payload") == "assistant_message"]
                self.assertEqual(replies, ["echo: one", "echo: two"])
                self.assertEqual(c.target, current.address)
                print(f"resumed from {first_address} to {current.address} after seq "
                      f"{[e.seq for e in seen if e.WhichOneof('payload') == 'assistant_message'][0]}")
        finally:
            current.close()

    async def resume_on_nats(self, end) -> None:
        """On one nats-server: the first `dev --nats` ended by `end`, the second started on a new port."""
        nats = NatsServer()
        try:
            def restart(old: DevServer) -> DevServer:
                end(old)
                old.close()
                return DevServer(nats_url=nats.url)

            await self.resume_across(lambda: DevServer(nats_url=nats.url), restart)
        finally:
            nats.close()

    async def test_nats_gateway_stopped_and_started_elsewhere(self):
        await self.resume_on_nats(DevServer.stop)

    async def test_nats_gateway_killed_and_started_elsewhere(self):
        await self.resume_on_nats(DevServer.kill)

    async def test_embedded_data_dir_restarted(self):
        with tempfile.TemporaryDirectory(prefix="turnstile-py-data-") as data:
            def restart(old: DevServer) -> DevServer:
                old.close()
                return DevServer(data_dir=Path(data))

            await self.resume_across(lambda: DevServer(data_dir=Path(data)), restart)


if __name__ == "__main__":
    unittest.main()
