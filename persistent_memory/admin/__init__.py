"""The Django admin: read-only views of the mirror's rows, with actions that call the services.

What lives here: ``sessions`` (sessions, their values and history), ``conversations``
(conversations and messages), ``memories`` (long-term memories), ``checkpoints`` (a
graph thread's checkpoints and chat on a session's page), ``forget`` (the forget-owners
action), ``transcript`` (a conversation's threads shaped for reading) and ``base`` (what
they share). Django's ``admin.autodiscover()`` imports this package: importing each
module here is what registers its ``ModelAdmin`` classes.

May import: the store and the services (``store``, ``conversations``, ``memories``,
``operations``), ``mirror``, ``models``, ``conf`` and the layers below them; nothing
imports the admin.
"""

from persistent_memory.admin.conversations import (
    ConversationInline,
    MemoryConversationAdmin,
    MemoryMessageAdmin,
)
from persistent_memory.admin.forget import ForgetOwnersMixin
from persistent_memory.admin.memories import LongTermMemoryAdmin
from persistent_memory.admin.sessions import (
    HistoryEntryAdmin,
    HistoryInline,
    MemorySessionAdmin,
    OwnerFilter,
    ReadOnlyMixin,
    StateFilter,
    SyncFilter,
    TTLFilter,
    ValueInline,
    duration,
    idle_since,
    pretty_json,
    short_when,
    state_label,
    when,
)

__all__ = [
    "ConversationInline",
    "ForgetOwnersMixin",
    "HistoryEntryAdmin",
    "HistoryInline",
    "LongTermMemoryAdmin",
    "MemoryConversationAdmin",
    "MemoryMessageAdmin",
    "MemorySessionAdmin",
    "OwnerFilter",
    "ReadOnlyMixin",
    "StateFilter",
    "SyncFilter",
    "TTLFilter",
    "ValueInline",
    "duration",
    "idle_since",
    "pretty_json",
    "short_when",
    "state_label",
    "when",
]
