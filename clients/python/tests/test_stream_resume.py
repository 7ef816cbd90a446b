"""A reply that streams on across a dropped connection (SPEC §14): the client reaches `turnstile dev`
through a TCP proxy that cuts every connection mid-reply; `watch()` reopens the stream with the step's
byte offsets as `resume`, and the deltas the caller saw concatenate exactly to the durable
`assistant/message` text, at contiguous offsets from 0: no byte missing, none twice. On the embedded
journal and on `--nats`. Also the client's bookkeeping of those offsets, without a server."""

from __future__ import annotations

import asyncio
import unittest
import uuid

from harness import Backend, bounded
from turnstile_client import AsyncClient, RetryPolicy, pb
from turnstile_client._client import _StreamingStep

#: Streamed by the scripted model in ten deltas over five seconds; multi-byte characters make byte
#: offsets differ from character counts.
SLOW = "[[delay:5000]] héllo wörld, this reply streams slowly in ten pieces 🎉 across a dropped connection"
#: The proxy cuts the connections after this many deltas: early, so that the reopened stream (about 0.2 s
#: later) still finds the step streaming, with seconds to spare on a busy machine.
CUT_AFTER = 2


class Proxy:
    """A TCP proxy on 127.0.0.1:0 in front of `target` ("host:port"). `cut()` aborts every connection it
    carries, as a network that dropped them; connections made later pass again."""

    def __init__(self, target: str):
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None  # a connection is served by a task of its own
        self._handlers.add(task)
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            down_w.transport.abort()
            return
        pair = {down_w, up_w}
        self._writers |= pair

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while chunk := await r.read(65536):
                    w.write(chunk)
                    await w.drain()
            except OSError:
                pass
            finally:
                for x in pair:
                    x.transport.abort()
                self._writers -= pair

        await asyncio.gather(pump(down_r, up_w), pump(up_r, down_w))

    def cut(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        # Every connection's pumps end once aborted: wait for them, so none is cancelled with the loop.
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


def delta_of(item: pb.WatchItem):
    if item.WhichOneof("item") == "live" and item.live.WhichOneof("payload") == "assistant_delta":
        return item.live.assistant_delta
    return None


def contiguous_from_zero(deltas: list) -> bool:
    at = 0
    for d in deltas:
        if d.offset != at:
            return False
        at += len(d.text.encode("utf-8"))
    return True


class Scenarios:
    BACKEND = "embedded"

    def setUp(self) -> None:
        self.backend = Backend(self.BACKEND)
        self.dev = self.backend.start()

    def tearDown(self) -> None:
        self.backend.close()

    async def test_a_reply_streams_on_across_a_dropped_connection_each_byte_once(self):
        proxy = Proxy(self.dev.address)
        address = await proxy.start()
        try:
            async with AsyncClient(address, retry=RetryPolicy(deadline=30.0)) as c:
                s = "py-" + uuid.uuid4().hex[:12]
                stream = c.watch(s)
                first = await bounded(anext(stream), "caught_up")
                self.assertEqual(first.WhichOneof("item"), "caught_up")
                await c.followup(s, SLOW)
                deltas, after_cut = [], []

                async def read_reply() -> str:
                    async for item in stream:
                        d = delta_of(item)
                        if d is not None:
                            deltas.append(d)
                            if len(deltas) == CUT_AFTER:
                                proxy.cut()
                            elif len(deltas) > CUT_AFTER:
                                after_cut.append(d)
                        elif item.WhichOneof("item") == "event" and item.event.WhichOneof("payload") == "assistant_message":
                            return item.event.assistant_message.text
                    raise AssertionError("the Watch ended")

                text = await bounded(read_reply(), "the reply")
                await stream.aclose()
        finally:
            await proxy.close()
        seen = [(d.offset, d.text) for d in deltas]
        log = f"deltas {seen}\nserver log:\n{self.dev.log_tail()}"
        self.assertGreaterEqual(proxy.accepted, 2, "the stream was reopened through the proxy")
        self.assertTrue(contiguous_from_zero(deltas), f"offsets contiguous from 0: {log}")
        self.assertTrue(after_cut, f"the reply went on streaming after the cut: {log}")
        self.assertEqual("".join(d.text for d in deltas), text, f"each byte of the reply once: {log}")
        print(f"{self.BACKEND}: {len(deltas)} deltas, {CUT_AFTER} before the cut, resumed at byte "
              f"{after_cut[0].offset} of {len(text.encode('utf-8'))}")


class EmbeddedTest(Scenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "embedded"


class NatsTest(Scenarios, unittest.IsolatedAsyncioTestCase):
    BACKEND = "nats"


def live_delta(turn: int, step: int, offset: int, text: str, reasoning: bool = False) -> pb.WatchItem:
    d = pb.AssistantDelta(turn=turn, step=step, offset=offset, text=text, reasoning=reasoning)
    return pb.WatchItem(live=pb.LiveEvent(type="assistant/delta", assistant_delta=d))


class StreamingStepTest(unittest.TestCase):
    """What a reopened stream asks for, given the items yielded so far."""

    def test_text_and_reasoning_advance_by_utf8_bytes_in_their_own_offset_spaces(self):
        p = _StreamingStep()
        self.assertIsNone(p.resume(), "nothing streams yet")
        p.advance(live_delta(2, 1, 0, "hmm", reasoning=True))
        p.advance(live_delta(2, 1, 0, "é🎉"))
        self.assertEqual(p.resume(), pb.StreamResume(turn=2, step=1, text_offset=6, reasoning_offset=3))

    def test_a_new_step_starts_at_zero_and_the_step_s_message_ends_it(self):
        p = _StreamingStep()
        p.advance(live_delta(2, 1, 0, "abc"))
        p.advance(live_delta(2, 2, 0, "x"))
        self.assertEqual(p.resume(), pb.StreamResume(turn=2, step=2, text_offset=1))
        other = pb.SessionEvent(seq=9, assistant_message=pb.AssistantMessage(turn=2, step=1, text="abc"))
        p.advance(pb.WatchItem(event=other))
        self.assertIsNotNone(p.resume(), "another step's message leaves the streaming one")
        done = pb.SessionEvent(seq=10, assistant_message=pb.AssistantMessage(turn=2, step=2, text="xy"))
        p.advance(pb.WatchItem(event=done))
        self.assertIsNone(p.resume(), "the durable message holds the whole text: nothing to resume")
        p.advance(live_delta(3, 1, 0, "a"))
        p.advance(pb.WatchItem(event=pb.SessionEvent(seq=11, turn_end=pb.TurnEnd(turn=3))))
        self.assertIsNone(p.resume(), "a turn's end ends its steps")


if __name__ == "__main__":
    unittest.main()
