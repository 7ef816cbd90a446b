"""The OpenAI Agents SDK (`openai-agents`), unmodified, running agents whose model is a Turnstile agent profile
through the Responses API of a real `turnstile dev` (tests/tests/openai_sdk.rs; OPENAI_BASE_URL, TOKEN_A).
The scripted agent answers `echo: <the texts of the entered messages>`; the SDK's `instructions` are the
response's instructions, entered before the input."""

import asyncio
import os
import unittest

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city today."""
    return f"sunny in {city}"


def agent(tools=()):
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["TOKEN_A"], max_retries=0)
    return Agent(name="turnstile", instructions="be brief", tools=list(tools),
                 model=OpenAIResponsesModel(model="scripted", openai_client=client))


class AgentsSdk(unittest.TestCase):
    def test_run_streamed_run_and_a_chained_run(self):
        async def scenario():
            a = agent()
            first = await Runner.run(a, "hello agents")
            self.assertEqual(first.final_output, "echo: be brief\nhello agents")
            streamed = Runner.run_streamed(a, "streamed agents")
            deltas = []
            async for event in streamed.stream_events():
                if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                    deltas.append(event.data.delta)
            self.assertEqual(streamed.final_output, "echo: be brief\nstreamed agents")
            self.assertEqual("".join(deltas), streamed.final_output)
            chained = await Runner.run(a, "second", previous_response_id=first.last_response_id)
            self.assertEqual(chained.final_output, "echo: be brief\nsecond")
            self.assertTrue(chained.last_response_id.startswith("resp_"))

        asyncio.run(scenario())

    def test_an_agent_runs_its_function_tool_through_the_waiting_turn(self):
        # The SDK resends its whole run with the function_call_output; the output answers the waiting turn.
        async def scenario():
            a = agent([get_weather])
            result = await Runner.run(a, '[[tool:get_weather {"city": "Paris"}]] weather?')
            self.assertEqual(result.final_output, "tool results: get_weather: sunny in Paris")
            kinds = [item.type for item in result.new_items]
            self.assertIn("tool_call_item", kinds)
            self.assertIn("tool_call_output_item", kinds)
            streamed = Runner.run_streamed(a, '[[tool:get_weather {"city": "Oslo"}]] and here?')
            async for _ in streamed.stream_events():
                pass
            self.assertEqual(streamed.final_output, "tool results: get_weather: sunny in Oslo")

        asyncio.run(scenario())


if __name__ == "__main__":
    unittest.main()
