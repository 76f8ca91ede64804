"""What the mirror's modules share to write rows: many rows in one ``executemany``, and the
store's epoch seconds as datetimes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import connections, router
from django.db.models import CharField, ForeignKey, IntegerField, Model, TextField


def _insert(model: type[Model], fields: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> None:
    """INSERT rows of column values with one ``executemany``.

    ``bulk_create`` builds a model instance per row, which was most of a sync's time
    after a busy second (tens of thousands of history rows); each value still goes
    through its field's own conversion for the database.
    """
    connection = connections[router.db_for_write(model)]
    columns = [model._meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    # Only quoted table and column names from the model go into the text; values are parameters.
    sql = "INSERT INTO {} ({}) VALUES ({})".format(  # noqa: S608
        quote(model._meta.db_table),
        ", ".join(quote(field.column) for field in columns),
        ", ".join(["%s"] * len(columns)),
    )
    # Integers and strings go to the driver as they are; dates and JSON need the field.
    plain = (IntegerField, CharField, TextField, ForeignKey)
    convert = [None if isinstance(field, plain) else field.get_db_prep_save for field in columns]
    params = [
        [
            value if to_db is None else to_db(value, connection)
            for to_db, value in zip(convert, row, strict=True)
        ]
        for row in rows
    ]
    if params:
        with connection.cursor() as cursor:
            cursor.executemany(sql, params)


def _datetime(epoch: Any, default: datetime) -> datetime:
    try:
        return datetime.fromtimestamp(float(epoch), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return default
