"""One process of tests/test_async_first_call.py: ``python -m tests.first_call PHASE``.

``write`` migrates the database and, through each integration, writes a conversation
(and a LangGraph checkpoint) of owner ``user:1``, then closes the store (its mirror's last
flush). Every other phase is a fresh process whose very first use of the store is from
inside an event loop (``asyncio.run``): it reads what ``write`` wrote through one
integration's async API and prints it as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memory_site.settings")
django.setup()

OWNER = "user:1"
THREAD = {"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}


def echo() -> Any:
    """A Pydantic AI agent whose model answers with the prompts it was sent (no network)."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, UserPromptPart)
        ]
        return ModelResponse(parts=[TextPart(" | ".join(str(p) for p in prompts))])

    return Agent(FunctionModel(answer))


async def write() -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
    from pydantic_ai.conversation import Conversation

    from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver
    from persistent_memory.integrations.openai_agents import PersistentMemorySession
    from persistent_memory.integrations.pydantic_ai import PersistentMemoryConversationStore

    await PersistentMemorySession("chat-1", owner=OWNER).add_items([{"role": "user", "content": "hello"}])
    store = PersistentMemoryConversationStore(owner=OWNER)
    result = await echo().run("first", conversation=Conversation(conversation_id="chat-2"))
    await store.save(result)
    checkpoint = generate_checkpoint(channel_values={"answer": 42}, channel_versions={"answer": 1})
    saver = PersistentMemorySaver.for_owner(OWNER)
    await saver.aput(THREAD, checkpoint, {"source": "input", "step": 0}, {"answer": 1})


async def agents_session() -> Any:
    from persistent_memory.integrations.openai_agents import PersistentMemorySession

    return await PersistentMemorySession("chat-1", owner=OWNER).get_items()


async def pydantic_ai_store() -> Any:
    from persistent_memory.integrations.pydantic_ai import PersistentMemoryConversationStore

    store = PersistentMemoryConversationStore(owner=OWNER)
    conversation = await store.load("chat-2")
    assert conversation is not None, "the conversation written by the earlier process is missing"
    # And the next turn goes on from it, in the same loop.
    result = await echo().run("second", conversation=conversation)
    await store.save(result)
    return result.output


async def langgraph_saver() -> Any:
    from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver

    saved = await PersistentMemorySaver.for_owner(OWNER).aget_tuple(THREAD)
    return None if saved is None else saved.checkpoint["channel_values"]


PHASES = {
    "agents_session": agents_session,
    "pydantic_ai_store": pydantic_ai_store,
    "langgraph_saver": langgraph_saver,
}

if __name__ == "__main__":
    phase = sys.argv[1]
    if phase == "write":
        from django.core.management import call_command

        from persistent_memory.store import get_store, reset_store

        call_command("migrate", verbosity=0)
        get_store()  # built (and restored) here, outside any loop: this phase is not under test
        asyncio.run(write())
        reset_store()  # the mirror's last flush
    else:
        print(json.dumps(asyncio.run(PHASES[phase]())))
