"""A background response streamed through gateway 0 is cut by that gateway's kill -9 mid-reply, then streamed
again with `starting_after` through gateway 1: every byte of the reply once, in order (SPEC §19, decision
0101). tests/tests/openai_sdk.rs runs it on a cluster of one worker and two gateways (auth off): this script
prints `CUT` once it has read part of the reply, the test kills gateway 0 and answers a line on stdin, and the
script resumes through gateway 1 and prints `OK`. The unmodified `openai` Python SDK does all the HTTP."""

import os
import sys

from openai import OpenAI

REPLY = "echo: every byte of this reply once and in order, after a gateway died mid-stream"


def gateway(g):
    return OpenAI(base_url=os.environ[f"OPENAI_BASE_URL_{g}"], api_key="unused-auth-is-off", max_retries=0,
                  timeout=60)


a, b = gateway(0), gateway(1)
r = a.responses.create(model="scripted", input="[[delay:3000]] " + REPLY[len("echo: "):], background=True)
first = []
stream = a.responses.retrieve(r.id, stream=True)
for event in stream:
    first.append(event)
    if len([e for e in first if e.type == "response.output_text.delta"]) == 2:
        break
print("CUT", flush=True)
sys.stdin.readline()  # gateway 0 is dead now, with this stream still open
rest = list(b.responses.retrieve(r.id, stream=True, starting_after=first[-1].sequence_number))
events = first + rest
numbers = [e.sequence_number for e in events]
assert numbers == sorted(set(numbers)), f"an event twice or out of order: {numbers}"
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
assert text == REPLY, f"the reply arrived as {text!r}"
assert events[-1].type == "response.completed", events[-1].type
assert b.responses.retrieve(r.id).output_text == REPLY
print("OK", flush=True)
