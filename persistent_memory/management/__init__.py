"""The ``manage.py memory_*`` commands (``commands/``), each a thin wrapper over the
store, the operations or the services, and what they share (``base``).

May import: everything but the admin (the commands sit at the top, beside the template
tags and the migrations).
"""
