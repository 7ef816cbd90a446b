"""A function call waits durably for its client (decision 0113): on a cluster of one worker and two gateways
(auth off), a response returns a function_call through gateway 0; this script prints `WAITING`, the test kills
the session's owner (kill -9 of the only worker) and starts it again, answers a line on stdin, and the
function_call_output is sent through gateway 1: the new owner took the waiting turn over, so the output
answers it and the turn goes on. Prints `OK`. The unmodified `openai` Python SDK does all the HTTP."""

import os
import sys
import time

import openai
from openai import OpenAI


def gateway(g):
    return OpenAI(base_url=os.environ[f"OPENAI_BASE_URL_{g}"], api_key="unused-auth-is-off", max_retries=0,
                  timeout=60)


a, b = gateway(0), gateway(1)
tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
r = a.responses.create(model="scripted", tools=[tool], input="[[tool:lookup {}]] find it")
call = r.output[-1]
assert call.type == "function_call", call.type
print("WAITING", flush=True)
sys.stdin.readline()  # the owner was killed and started again
deadline = time.monotonic() + 60
while True:
    try:
        done = b.responses.create(model="scripted", previous_response_id=r.id, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "found after failover"}])
        break
    except openai.APIStatusError as e:
        # 503 while the shard finds its new owner; anything else is a failure.
        if e.status_code != 503 or time.monotonic() > deadline:
            raise
assert done.output_text == "tool results: lookup: found after failover", done.output_text
print("OK", flush=True)
