"""The OpenAI chat format's rules, shared by the backends and the conversations service.

What lives here: a message's shape, its stored text and its id (``messages``), its tokens
counted as OpenAI's tokenizers count them, from the encodings shipped in ``encodings/``
(``tokens``), the window of a thread within a budget (``window``), and a whole
conversation as a backend's snapshot and as an export record (``records``).

These are rules, not services: the backends store what they prepare and the
conversations' store methods (:mod:`persistent_memory.conversations`) call them, so they
sit below both. May import: the layers below them in pyproject.toml's ``layers`` (today
``validation`` and ``exceptions``); never a backend, the conversations or the store.
"""
