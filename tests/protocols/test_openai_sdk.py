"""The OpenAI Responses and Conversations API of Turnstile (docs/PROTOCOLS.md) through the official, unmodified
`openai` Python SDK, against a real `turnstile dev` that tests/tests/openai_sdk.rs starts with two tenants'
tokens (OPENAI_BASE_URL, TOKEN_A, TOKEN_B). The scripted agent answers `echo: <text>` and obeys its directives
(`[[delay:MS]]` streams slowly, `[[fail]]` fails the model request)."""

import base64
import os
import unittest
import uuid

import openai
from openai import OpenAI

BASE_URL = os.environ["OPENAI_BASE_URL"]
TOKEN_A = os.environ["TOKEN_A"]
TOKEN_B = os.environ["TOKEN_B"]
MODEL = "scripted"


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city today.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def client(token=TOKEN_A):
    return OpenAI(base_url=BASE_URL, api_key=token, max_retries=0, timeout=60)


class Responses(unittest.TestCase):
    def test_models_lists_the_agent_profiles(self):
        ids = [m.id for m in client().models.list()]
        self.assertIn(MODEL, ids)
        self.assertEqual(client().models.retrieve(MODEL).id, MODEL)

    def test_create_answers_with_the_turns_reply_and_usage(self):
        r = client().responses.create(model=MODEL, input="[[usage:12,5]] hello there", metadata={"team": "blue"})
        self.assertEqual(r.status, "completed")
        self.assertEqual(r.output_text, "echo: hello there")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(r.metadata, {"team": "blue"})
        self.assertEqual((r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens), (12, 5, 17))
        again = client().responses.retrieve(r.id)
        self.assertEqual(again.output_text, "echo: hello there")
        self.assertEqual([o.id for o in again.output], [o.id for o in r.output])
        items = client().responses.input_items.list(r.id)
        self.assertEqual([i.content[0].text for i in items.data], ["[[usage:12,5]] hello there"])

    def test_previous_response_id_continues_the_same_session(self):
        first = client().responses.create(model=MODEL, input="one")
        second = client().responses.create(model=MODEL, input="two", previous_response_id=first.id,
                                           instructions="be brief")
        self.assertEqual(second.output_text, "echo: be brief\ntwo")
        self.assertEqual(second.instructions, "be brief")
        self.assertNotEqual(first.id, second.id)

    def test_streaming_gives_the_documented_events_with_rising_sequence_numbers(self):
        events = list(client().responses.create(model=MODEL, input="[[delay:300]] streamed", stream=True))
        types = [e.type for e in events]
        self.assertEqual(types[:2], ["response.created", "response.in_progress"])
        for expected in ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
                         "response.output_text.done", "response.content_part.done", "response.output_item.done"]:
            self.assertIn(expected, types)
        self.assertEqual(types[-1], "response.completed")
        numbers = [e.sequence_number for e in events]
        self.assertEqual(numbers, sorted(set(numbers)))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, events[-1].response.output_text)
        self.assertEqual(text, "echo: streamed")

    def test_the_sdk_stream_helper_accumulates_the_final_response(self):
        with client().responses.stream(model=MODEL, input="helper") as stream:
            for _ in stream:
                pass
            final = stream.get_final_response()
        self.assertEqual(final.output_text, "echo: helper")

    def test_a_background_response_resumes_from_any_sequence_number_with_nothing_missed_or_repeated(self):
        r = client().responses.create(model=MODEL, input="[[delay:1500]] slow and steady", background=True)
        self.assertIn(r.status, ("queued", "in_progress"))
        self.assertTrue(r.background)
        # Read part of the stream, drop it, resume after the last event seen: the concatenation is the
        # whole stream exactly once.
        first = []
        with client().responses.retrieve(r.id, stream=True) as stream:
            for event in stream:
                first.append(event)
                if event.type == "response.output_text.delta" and len(
                        [e for e in first if e.type == "response.output_text.delta"]) == 2:
                    break
        rest = list(client().responses.retrieve(r.id, stream=True, starting_after=first[-1].sequence_number))
        events = first + rest
        numbers = [e.sequence_number for e in events]
        self.assertEqual(numbers, sorted(set(numbers)), "no event twice, in order")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, "echo: slow and steady")
        self.assertEqual(events[-1].type, "response.completed")
        # After the end, a stream from the start replays the same events from the log alone.
        replay = list(client().responses.retrieve(r.id, stream=True))
        self.assertEqual(replay[0].sequence_number, events[0].sequence_number)
        self.assertEqual(replay[-1].sequence_number, events[-1].sequence_number)
        self.assertEqual("".join(e.delta for e in replay if e.type == "response.output_text.delta"), text)
        self.assertEqual(client().responses.retrieve(r.id).status, "completed")

    def test_cancel_ends_a_background_response_cancelled(self):
        r = client().responses.create(model=MODEL, input="[[tool:sleep 30000]] wait", background=True)
        cancelled = client().responses.cancel(r.id)
        self.assertEqual(cancelled.status, "cancelled")
        self.assertEqual(client().responses.retrieve(r.id).status, "cancelled")

    def test_a_failed_turn_is_a_failed_response(self):
        r = client().responses.create(model=MODEL, input="[[fail]]")
        self.assertEqual(r.status, "failed")
        self.assertIsNotNone(r.error)

    def test_an_idempotency_key_makes_a_retried_create_a_no_op(self):
        key = str(uuid.uuid4())
        a = client().responses.create(model=MODEL, input="once", extra_headers={"Idempotency-Key": key})
        b = client().responses.create(model=MODEL, input="once", extra_headers={"Idempotency-Key": key})
        self.assertEqual(a.id, b.id)
        self.assertEqual(len(client().responses.input_items.list(a.id).data), 1)

    def test_an_approval_ends_the_response_and_the_next_one_decides_it(self):
        r = client().responses.create(model="guarded", input="[[tool:echo approved text]] go")
        self.assertEqual(r.status, "completed")
        request = r.output[-1]
        self.assertEqual((request.type, request.name, request.server_label), ("mcp_approval_request", "echo", "turnstile"))
        decided = client().responses.create(model="guarded", previous_response_id=r.id, input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
        self.assertEqual(decided.status, "completed")
        self.assertEqual([o.type for o in decided.output], ["mcp_call", "message"])
        self.assertEqual((decided.output[0].name, decided.output[0].output), ("echo", "approved text"))
        self.assertIn("approved text", decided.output_text)
        # Deciding again is refused: the call is no longer waiting.
        with self.assertRaises(openai.ConflictError):
            client().responses.create(model="guarded", previous_response_id=r.id, input=[
                {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])

    def test_a_denied_call_ends_with_its_error(self):
        r = client().responses.create(model="guarded", input="[[tool:echo nope]] go", stream=True)
        events = list(r)
        request = events[-1].response.output[-1]
        self.assertEqual(request.type, "mcp_approval_request")
        denied = client().responses.create(model="guarded", previous_response_id=events[-1].response.id, input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False,
             "reason": "not today"}], stream=True)
        events = list(denied)
        self.assertEqual(events[-1].type, "response.completed")
        numbers = [e.sequence_number for e in events]
        self.assertEqual(numbers, sorted(set(numbers)))
        call = events[-1].response.output[0]
        self.assertEqual(call.type, "mcp_call")
        self.assertEqual(call.status, "failed")
        self.assertIn("not today", str(call.error))

    def test_a_function_tool_round_trip(self):
        # The request's function tool is a client tool of its turn: the response ends at its call, and the
        # next request's function_call_output answers it in the same, waiting turn.
        r = client().responses.create(model=MODEL, tools=[WEATHER],
                                      input='[[tool:get_weather {"city": "Paris"}]] weather?')
        self.assertEqual(r.status, "completed")
        self.assertEqual([o.type for o in r.output], ["message", "function_call"])
        call = r.output[-1]
        self.assertEqual((call.name, call.arguments), ("get_weather", '{"city": "Paris"}'))
        self.assertTrue(call.call_id.startswith("call_"))
        done = client().responses.create(model=MODEL, previous_response_id=r.id, tools=[WEATHER], input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
        self.assertEqual(done.status, "completed")
        self.assertEqual(done.output_text, "tool results: get_weather: sunny")
        # The call is answered: a second output for it is refused.
        with self.assertRaises(openai.ConflictError):
            client().responses.create(model=MODEL, previous_response_id=r.id, input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "again"}])
        # Another tenant cannot answer it, nor learn it exists.
        with self.assertRaises(openai.NotFoundError):
            client(TOKEN_B).responses.create(model=MODEL, input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "x"}])

    def test_a_streamed_function_call_and_its_answer(self):
        stream = client().responses.create(model=MODEL, tools=[WEATHER], stream=True,
                                           input='[[tool:get_weather {"city": "Oslo"}]] go')
        events = list(stream)
        kinds = [e.type for e in events]
        self.assertIn("response.function_call_arguments.done", kinds)
        self.assertEqual(kinds[-1], "response.completed")
        numbers = [e.sequence_number for e in events]
        self.assertEqual(numbers, sorted(set(numbers)))
        call = events[-1].response.output[-1]
        self.assertEqual(call.type, "function_call")
        answered = client().responses.create(model=MODEL, stream=True, input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "snow"}])
        events = list(answered)
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual(events[-1].response.output_text, "tool results: get_weather: snow")
        # Retrieving the answered response later reads the same from the log.
        again = client().responses.retrieve(events[-1].response.id)
        self.assertEqual(again.output_text, "tool results: get_weather: snow")

    def test_bad_tools_are_400_naming_the_field(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            client().responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
        self.assertEqual(caught.exception.param, "tools[0].type")
        with self.assertRaises(openai.BadRequestError) as caught:
            client().responses.create(model=MODEL, input="x", tools=[{"type": "function", "name": "bad name"}])
        self.assertEqual(caught.exception.param, "tools[0].name")
        with self.assertRaises(openai.NotFoundError) as caught:
            client().responses.create(model=MODEL, input=[
                {"type": "function_call_output", "call_id": "call_unknown", "output": "x"}])
        self.assertEqual(caught.exception.param, "input[0].call_id")

    def test_delete_removes_the_response(self):
        r = client().responses.create(model=MODEL, input="bye")
        client().responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            client().responses.retrieve(r.id)


class StructuredOutput(unittest.TestCase):
    """``text.format`` is the turn's output schema (SPEC §20): the scripted model answers a turn that has one
    with its prompt as it is, so the prompt decides whether the reply matches."""

    def test_parse_with_a_pydantic_model_gets_the_reply_parsed(self):
        from pydantic import BaseModel

        class City(BaseModel):
            city: str

        r = client().responses.parse(model=MODEL, input='{"city": "Paris"}', text_format=City)
        self.assertEqual(r.status, "completed")
        self.assertEqual(r.output_parsed, City(city="Paris"))

    def test_a_reply_that_does_not_match_is_retried_once_then_fails_invalid_output(self):
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False}
        text = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
        r = client().responses.create(model=MODEL, input="Paris, of course.", text=text)
        self.assertEqual(r.status, "failed")
        self.assertEqual(r.error.code, "invalid_output")
        ok = client().responses.create(model=MODEL, input='{"city": "Lyon"}', text={"format": {"type": "json_object"}})
        self.assertEqual((ok.status, ok.output_text), ("completed", '{"city": "Lyon"}'))

    def test_a_bad_format_is_refused_naming_the_field(self):
        for fmt, param in [({"type": "json_schema", "name": "a b", "schema": {"type": "object"}}, "text.format"),
                           ({"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}, "text.format"),
                           ({"type": "yaml"}, "text.format.type")]:
            with self.assertRaises(openai.BadRequestError) as caught:
                client().responses.create(model=MODEL, input="x", text={"format": fmt})
            self.assertEqual(caught.exception.param, param, caught.exception.message)


class Errors(unittest.TestCase):
    def test_an_unknown_model_is_404_model_not_found(self):
        with self.assertRaises(openai.NotFoundError) as caught:
            client().responses.create(model="gpt-nonexistent", input="hi")
        self.assertEqual(caught.exception.code, "model_not_found")
        self.assertEqual(caught.exception.param, "model")
        self.assertIn("scripted", caught.exception.message)

    def test_a_bad_token_is_401(self):
        with self.assertRaises(openai.AuthenticationError):
            client("not-a-token").responses.create(model=MODEL, input="hi")
        with self.assertRaises(openai.AuthenticationError):
            client("not-a-token").models.list()

    def test_another_tenants_response_is_404(self):
        r = client(TOKEN_A).responses.create(model=MODEL, input="secret of a")
        with self.assertRaises(openai.NotFoundError):
            client(TOKEN_B).responses.retrieve(r.id)
        with self.assertRaises(openai.NotFoundError):
            client(TOKEN_B).responses.create(model=MODEL, input="x", previous_response_id=r.id)

    def test_a_bad_field_is_400_naming_it(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            client().responses.create(model=MODEL, input=[{"role": "robot", "content": "x"}])
        self.assertEqual(caught.exception.param, "input[0].role")
        with self.assertRaises(openai.NotFoundError):
            client().responses.retrieve("resp_notours")
        # An id of the caller's own session past the end of its log names no response either, streamed or not.
        real = client().responses.create(model=MODEL, input="exists")
        session = base64.urlsafe_b64decode(real.id[5:] + "==").decode().split(".")[0]
        forged = "resp_" + base64.urlsafe_b64encode(f"{session}.999.0.r".encode()).decode().rstrip("=")
        with self.assertRaises(openai.NotFoundError):
            client().responses.retrieve(forged)
        with self.assertRaises(openai.NotFoundError):
            client().responses.retrieve(forged, stream=True)


class Conversations(unittest.TestCase):
    def test_a_conversation_holds_its_items_metadata_and_responses(self):
        conv = client().conversations.create(items=[{"role": "user", "content": "remember 42"}],
                                             metadata={"topic": "numbers"})
        self.assertTrue(conv.id.startswith("conv_"))
        self.assertEqual(conv.metadata, {"topic": "numbers"})
        r = client().responses.create(model=MODEL, input="what number?", conversation=conv.id)
        self.assertEqual(r.output_text, "echo: what number?")
        self.assertEqual(r.conversation.id, conv.id)
        items = client().conversations.items.list(conv.id, order="asc")
        texts = [(i.role, i.content[0].text) for i in items.data]
        self.assertEqual(texts, [("user", "remember 42"), ("user", "what number?"),
                                 ("assistant", "echo: what number?")])
        # The reply's item id is the same in the response and in the conversation.
        self.assertEqual(items.data[-1].id, r.output[0].id)
        added = client().conversations.items.create(conv.id, items=[{"role": "user", "content": "and 7"}])
        self.assertEqual(added.data[0].content[0].text, "and 7")
        self.assertEqual(client().conversations.items.retrieve(added.data[0].id, conversation_id=conv.id).id,
                         added.data[0].id)
        updated = client().conversations.update(conv.id, metadata={"topic": "letters"})
        self.assertEqual(updated.metadata, {"topic": "letters"})
        self.assertEqual(client().conversations.retrieve(conv.id).metadata, {"topic": "letters"})
        with self.assertRaises(openai.NotFoundError):
            client(TOKEN_B).conversations.retrieve(conv.id)
        deleted = client().conversations.delete(conv.id)
        self.assertTrue(deleted.deleted)
        with self.assertRaises(openai.NotFoundError):
            client().conversations.retrieve(conv.id)

    def test_a_retried_create_with_an_idempotency_key_is_the_same_conversation(self):
        key = {"Idempotency-Key": str(uuid.uuid4())}
        a = client().conversations.create(items=[{"role": "user", "content": "x"}], metadata={"k": "v"},
                                          extra_headers=key)
        b = client().conversations.create(items=[{"role": "user", "content": "x"}], metadata={"k": "v"},
                                          extra_headers=key)
        self.assertEqual(a.id, b.id)
        self.assertEqual([i.content[0].text for i in client().conversations.items.list(a.id).data], ["x"])

    def test_steer_delivers_into_the_running_turn(self):
        conv = client().conversations.create()
        first = client().responses.create(model=MODEL, input="[[tool:sleep 1500]] working", conversation=conv.id,
                                          background=True)
        steered = client().responses.create(model=MODEL, input="also this", conversation=conv.id,
                                            extra_body={"delivery": "steer"})
        done = client().responses.retrieve(first.id)
        self.assertEqual(done.status, "completed")
        # The steer joined the running turn: its response is the rest of that turn, from the step it entered.
        self.assertEqual(done.output_text, "echo: working" + "echo: also this")
        self.assertEqual(steered.output_text, "echo: also this")
        self.assertEqual(steered.output[-1].id, done.output[-1].id)
        inputs = [i.content[0].text for i in client().responses.input_items.list(first.id, order="asc").data]
        self.assertEqual(inputs, ["[[tool:sleep 1500]] working", "also this"])


if __name__ == "__main__":
    unittest.main()
