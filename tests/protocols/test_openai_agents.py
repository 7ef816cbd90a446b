"""The OpenAI Agents SDK (`openai-agents`), unmodified, running agents whose model is a Turnstile agent profile
through the Responses API of a real `turnstile dev` (tests/tests/openai_sdk.rs; OPENAI_BASE_URL, TOKEN_A).
The scripted agent answers `echo: <the texts of the entered messages>`; the SDK's `instructions` are the
response's instructions, entered before the input."""

import asyncio
import os
import unittest

from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)


def agent():
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["TOKEN_A"], max_retries=0)
    return Agent(name="turnstile", instructions="be brief",
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


if __name__ == "__main__":
    unittest.main()
