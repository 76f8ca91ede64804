"""The local Responses API server (tests/responses_server.py) against the real clients:
if these fail, a test built on the server would be testing the server, not our code."""

from __future__ import annotations

import asyncio

import agents
import openai
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

from tests.responses_server import call, reasoning, responses_server, text


def test_openai_client_parses_the_scripted_replies():
    def count_inputs(body):
        return [text(f"{len(body['input'])} items")]

    with responses_server([reasoning("Thinking."), text("Hello.")], count_inputs) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        first = client.responses.create(model="m", input="hi")
        second = client.responses.create(model="m", input=[{"role": "user", "content": "a"}] * 3)
        third = client.responses.create(model="m", input="again")

    assert isinstance(first, openai.types.responses.Response)
    assert [item.type for item in first.output] == ["reasoning", "message"]
    assert first.output_text == "Hello."
    assert first.usage.total_tokens == 17
    assert second.output_text == "3 items"
    assert third.output_text == "Done."  # the script ran out
    assert [body["input"] for body in server.requests][::2] == ["hi", "again"]


def test_agents_sdk_runs_a_tool_call_against_the_server():
    received = []

    @function_tool
    def lookup(city: str) -> str:
        """The weather in a city."""
        received.append(city)
        return "sunny"

    async def run(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
        model = OpenAIResponsesModel(model="gpt-test", openai_client=client)
        agent = Agent(name="weather", instructions="Answer.", model=model, tools=[lookup])
        return await Runner.run(agent, "question", run_config=RunConfig(tracing_disabled=True))

    with responses_server([call("lookup", {"city": "Oslo"}, call_id="call_1")], [text("final")]) as server:
        result = asyncio.run(run(server.url))

    assert result.final_output == "final"
    assert received == ["Oslo"]
    assert [tool["name"] for tool in server.requests[0]["tools"]] == ["lookup"]
    items = server.requests[1]["input"]
    function_call = next(item for item in items if item.get("type") == "function_call")
    output = next(item for item in items if item.get("type") == "function_call_output")
    assert (function_call["call_id"], function_call["name"]) == ("call_1", "lookup")
    assert (output["call_id"], output["output"]) == ("call_1", "sunny")
    assert isinstance(result.raw_responses[-1], agents.ModelResponse)
