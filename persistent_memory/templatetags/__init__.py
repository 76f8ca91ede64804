"""The admin's template tags (conversation transcripts).

May import: the admin (its transcripts) and ``models``.
"""
