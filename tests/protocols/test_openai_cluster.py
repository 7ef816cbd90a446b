"""OpenAI objects are views of the log, answered by any gateway (SPEC §19, decisions 0101 and 0102): on a
cluster of one worker and two gateways (tests/tests/openai_sdk.rs; OPENAI_BASE_URL_0 and _1, auth off), a
response streamed in part through one gateway resumes through the other with nothing missed or repeated,
a conversation made through one is used and read through the other, and a function call returned by one is
answered through the other (its output is a command routed to the session's owner, decision 0113)."""

import os
import unittest

from openai import OpenAI

MODEL = "scripted"


def gateway(g):
    return OpenAI(base_url=os.environ[f"OPENAI_BASE_URL_{g}"], api_key="unused-auth-is-off", max_retries=0,
                  timeout=60)


class AnyGateway(unittest.TestCase):
    def test_a_stream_resumes_through_the_other_gateway(self):
        a, b = gateway(0), gateway(1)
        r = a.responses.create(model=MODEL, input="[[delay:1500]] across two gateways", background=True)
        first = []
        with a.responses.retrieve(r.id, stream=True) as stream:
            for event in stream:
                first.append(event)
                if len([e for e in first if e.type == "response.output_text.delta"]) == 2:
                    break
        rest = list(b.responses.retrieve(r.id, stream=True, starting_after=first[-1].sequence_number))
        events = first + rest
        numbers = [e.sequence_number for e in events]
        self.assertEqual(numbers, sorted(set(numbers)), "no event twice, in order")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, "echo: across two gateways")
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual(a.responses.retrieve(r.id).model_dump(), b.responses.retrieve(r.id).model_dump())

    def test_a_conversation_made_through_one_gateway_is_used_through_the_other(self):
        a, b = gateway(0), gateway(1)
        conv = a.conversations.create(items=[{"role": "user", "content": "first"}])
        reply = b.responses.create(model=MODEL, input="second", conversation=conv.id)
        self.assertEqual(reply.output_text, "echo: second")
        texts = [i.content[0].text for i in a.conversations.items.list(conv.id, order="asc").data]
        self.assertEqual(texts, ["first", "second", "echo: second"])

    def test_a_function_call_returned_by_one_gateway_is_answered_through_the_other(self):
        a, b = gateway(0), gateway(1)
        tool = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
        r = a.responses.create(model=MODEL, tools=[tool], input="[[tool:lookup {}]] find it")
        call = r.output[-1]
        self.assertEqual(call.type, "function_call")
        done = b.responses.create(model=MODEL, previous_response_id=r.id, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "found"}])
        self.assertEqual(done.output_text, "tool results: lookup: found")
        self.assertEqual(a.responses.retrieve(done.id).output_text, "tool results: lookup: found")


if __name__ == "__main__":
    unittest.main()
