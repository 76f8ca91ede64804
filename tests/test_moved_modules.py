"""The import paths that moved into packages (issue 43) still import, as the same module,
with a DeprecationWarning that names the new path; the public names a project imports
from the packages are there without one."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import persistent_memory
from persistent_memory import MOVED_MODULES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_path_imports_the_new_module_with_a_warning(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new  # its own name and spec, not a copy under the old one
    assert sys.modules[old] is module


def test_a_setting_that_names_an_old_path_reaches_the_same_callable():
    from django.utils.module_loading import import_string

    from persistent_memory.owners.resolvers import user_owner

    sys.modules.pop("persistent_memory.resolvers", None)
    with pytest.warns(DeprecationWarning):
        assert import_string("persistent_memory.resolvers.user_owner") is user_owner


def test_from_import_of_an_old_path_works():
    sys.modules.pop("persistent_memory.debug", None)
    with pytest.warns(DeprecationWarning):
        from persistent_memory.debug import SafeExceptionReporterFilter
    from persistent_memory.errors.debug import SafeExceptionReporterFilter as moved

    assert SafeExceptionReporterFilter is moved


def test_an_old_path_inside_a_package_that_stays_imports_as_an_attribute_too():
    # persistent_memory.conversations stays; only some of its modules moved to chat.
    import persistent_memory.conversations as conversations
    from persistent_memory.chat import tokens

    sys.modules.pop("persistent_memory.conversations.tokens", None)
    vars(conversations).pop("tokens", None)
    with pytest.warns(DeprecationWarning, match="persistent_memory.chat.tokens"):
        from persistent_memory.conversations import tokens as old
    assert old is tokens
    assert conversations.tokens is tokens
    with pytest.warns(DeprecationWarning):
        sys.modules.pop("persistent_memory.conversations.messages", None)
        from persistent_memory.conversations.messages import prepare_messages
    from persistent_memory.chat.messages import prepare_messages as moved

    assert prepare_messages is moved


def test_the_backend_contract_still_names_the_conversation_snapshot():
    from persistent_memory.backends.conversations import ConversationSnapshot
    from persistent_memory.chat.records import ConversationSnapshot as moved

    assert ConversationSnapshot is moved


@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("persistent_memory", ["MemoryStore", "get_store", "reset_store"]),
        ("persistent_memory.chat.messages", ["prepare_messages", "stored_text", "PreparedMessage"]),
        ("persistent_memory.chat.tokens", ["text_counter", "message_tokens", "TIKTOKEN_ENCODINGS"]),
        ("persistent_memory.chat.window", ["Link", "Window", "select"]),
        ("persistent_memory.chat.records", ["ConversationSnapshot", "export_conversations"]),
        ("persistent_memory.backends.conversations", ["ConversationSnapshot", "Summary", "text_digest"]),
        ("persistent_memory.store", ["MemoryStore", "get_store", "reset_store"]),
        ("persistent_memory.pipeline", ["MemoryFilter"]),
        ("persistent_memory.exceptions", ["PersistentMemoryError", "SessionNotFound"]),
        ("persistent_memory.conf", ["memory_settings"]),
        ("persistent_memory.owners", ["storage_id", "validate_owner"]),
        ("persistent_memory.mirror", ["Mirror", "SyncResult"]),
        (
            "persistent_memory.admin",
            [
                "MemorySessionAdmin",
                "HistoryEntryAdmin",
                "MemoryConversationAdmin",
                "MemoryMessageAdmin",
                "LongTermMemoryAdmin",
                "ConversationInline",
                "ReadOnlyMixin",
                "ForgetOwnersMixin",
                "OwnerFilter",
                "duration",
            ],
        ),
    ],
)
def test_public_names_import_from_their_paths_without_a_warning(path, names):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        module = importlib.import_module(path)
        for name in names:
            assert getattr(module, name) is not None, f"{path}.{name}"


def test_an_unknown_module_of_the_package_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("persistent_memory.no_such_module")
    assert "persistent_memory.no_such_module" not in MOVED_MODULES
    assert persistent_memory.__name__ == "persistent_memory"


def test_the_admin_registers_every_model_admin():
    from django.contrib import admin

    from persistent_memory import models

    registered = {model for model in admin.site._registry if model._meta.app_label == "persistent_memory"}
    assert registered == {
        models.MemorySession,
        models.HistoryEntry,
        models.MemoryConversation,
        models.MemoryMessage,
        models.LongTermMemory,
    }
