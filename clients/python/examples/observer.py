"""Observer: follow one session straight from NATS, without the gRPC API (docs/SUBJECTS.md).

    python examples/observer.py nats://127.0.0.1:4222 default s1
    python examples/observer.py tls://nats:4222 acme s1 --creds observer.creds --inbox-prefix _INBOX_acme --until-idle

It replays the session's durable events from JetStream in seq order (a consumer filtered to its subject),
then follows new ones, and prints the live events published meanwhile. Needs nats-py and the Python client
(for the generated `turnstile.v1` messages): `pip install nats-py ./clients/python`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from turnstile_client import pb


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def partition(tenant: str, session: str, shards: int = 256, partitions: int = 1) -> int:
    return (fnv1a64(f"{tenant}/{session}".encode()) % shards) % partitions


def events_of(msg) -> list:
    """The events one stored message holds: a group when it has `Turnstile-Last-Seq`, else one event."""
    headers = msg.headers or {}
    if "Turnstile-Last-Seq" in headers:
        group = pb.SessionEventGroup()
        group.ParseFromString(msg.data)
        return list(group.events)
    event = pb.SessionEvent()
    event.ParseFromString(msg.data)
    return [event]


async def observe(args: argparse.Namespace) -> int:
    options = {"user_credentials": args.creds} if args.creds else {}
    if args.inbox_prefix:
        options["inbox_prefix"] = args.inbox_prefix
    nc = await nats.connect(args.url, **options)
    p = partition(args.tenant, args.session, partitions=args.partitions)
    stream = f"TURNSTILE_EVENTS_{p}"
    subject = f"turnstile.ev.{p}.{args.tenant}.{args.session}"
    idle = asyncio.Event()

    async def on_live(msg) -> None:
        live = pb.LiveEvent()
        live.ParseFromString(msg.data)
        print(f"~ {live.type} after #{live.after_seq}", flush=True)

    last = 0
    idles = 0

    async def on_stored(msg) -> None:
        nonlocal last, idles
        for event in events_of(msg):
            if event.seq == 1 and last > 0:
                # The session was deleted (its subject purged) and its id used again: a new log.
                print(f"== session {args.tenant}/{args.session} was deleted; a new log starts", flush=True)
                last = 0
            if event.seq <= last:
                continue  # an ordered consumer that recreated itself may deliver again
            if event.seq != last + 1 and last > 0:
                print(f"!! gap: seq {last + 1}..{event.seq - 1} missing", flush=True)
            last = event.seq
            payload = event.WhichOneof("payload")
            if payload is None and not event.ignorable:
                print(f"!! #{event.seq} has type {event.type} this observer does not know; stopping", flush=True)
                idle.set()
                return
            line = f"#{event.seq} {event.type}"
            if payload == "assistant_message":
                line += f" {event.assistant_message.text!r}"
            elif payload == "status":
                line += " " + pb.SessionStatus.Name(event.status.status)
            print(line, flush=True)
            if payload == "status" and event.status.status == pb.SESSION_STATUS_IDLE:
                idles += 1
                if args.until_idle and idles >= args.until_idle:
                    idle.set()

    await nc.subscribe(f"turnstile.live.{args.tenant}.{args.session}.>", cb=on_live)
    js = nc.jetstream()
    # A named consumer filtered to this session's subject: its create request goes to
    # $JS.API.CONSUMER.CREATE.<stream>.<name>.<subject>, which NATS permissions can confine to one tenant
    # (docs/SUBJECTS.md, "Permissions"). No acks and no flow control: the observer publishes nothing else.
    consumer = ConsumerConfig(
        name=f"observer-{uuid.uuid4().hex}",
        ack_policy=AckPolicy.NONE,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=30.0,
    )
    await js.subscribe(
        subject,
        stream=stream,
        config=consumer,
        deliver_policy=DeliverPolicy.ALL,
        manual_ack=True,
        cb=on_stored,
    )
    print(f"observing {subject} in {stream}", flush=True)
    try:
        if args.until_idle:
            await asyncio.wait_for(idle.wait(), timeout=args.timeout)
        else:
            await asyncio.Event().wait()
    except asyncio.TimeoutError:
        print(f"!! not idle within {args.timeout} s", file=sys.stderr)
        return 1
    finally:
        await nc.drain()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="NATS URL, e.g. nats://127.0.0.1:4222")
    parser.add_argument("tenant")
    parser.add_argument("session")
    parser.add_argument("--partitions", type=int, default=1, help="the cluster's partition count (default 1)")
    parser.add_argument("--creds", help="a NATS .creds file (operator-mode NATS)")
    parser.add_argument("--inbox-prefix", help="reply subjects under this prefix instead of _INBOX")
    parser.add_argument("--until-idle", type=int, nargs="?", const=1, default=0, metavar="N",
                        help="exit at the N-th durable agent/status idle (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="with --until-idle: give up after this many s")
    return asyncio.run(observe(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
