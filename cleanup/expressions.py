"""ORM expressions the engine's statements are built from, and the field its chunk
messages are inserted through."""

from __future__ import annotations

from django.db.models import (
    BooleanField,
    CharField,
    Count,
    DateTimeField,
    Expression,
    F,
    Func,
    JSONField,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce


def count_of(rows: QuerySet) -> Coalesce:
    """How many ``rows`` there are, as an expression to read inside another statement:
    grouped by a constant, the subquery has one row, or none (hence the Coalesce)."""
    return Coalesce(Subquery(rows.order_by().annotate(one=Value(1)).values("one")
                             .annotate(n=Count("pk")).values("n")), 0)


class PairsIn(Expression):
    """``(a, b) IN (SELECT * FROM unnest(%s::type_a[], %s::type_b[]))``.

    The pairs travel as two array parameters, so the statement's text does not grow
    with the chunk. Each array is sent as one PostgreSQL array literal: Django binds
    parameters on the client, and psycopg's element-by-element array quoting took
    longer than the DELETE itself on a 2,000-row chunk. It compares the row's own
    columns: PostgreSQL re-checks it against a row version that a concurrent update
    produced, which a subquery over the table itself would not.
    """

    output_field = BooleanField()
    conditional = True

    def __init__(self, first: str, second: str, pairs):
        super().__init__()
        self.fields = (first, second)
        self.pairs = list(pairs)
        self.columns = ()

    def resolve_expression(self, query=None, allow_joins=True, reuse=None, summarize=False,
                           for_save=False):
        resolved = self.copy()
        resolved.columns = tuple(
            F(name).resolve_expression(query, allow_joins=False, reuse=reuse)
            for name in self.fields
        )
        return resolved

    def get_source_expressions(self):
        return list(self.columns)

    def set_source_expressions(self, expressions):
        self.columns = tuple(expressions)

    def as_sql(self, compiler, connection):
        # Plain columns of the model compile without parameters, so they can repeat.
        columns = [compiler.compile(column)[0] for column in self.columns]
        types = [column.output_field.db_type(connection) for column in self.columns]
        # AutoFields report "bigserial"-like types only when created; compare as bigint.
        types = [t.replace("bigserial", "bigint").replace("serial", "integer") for t in types]
        pairs = [(first, second) for first, second in self.pairs if second is not None]
        sql = (
            f"({columns[0]}, {columns[1]}) IN "
            f"(SELECT * FROM unnest(%s::{types[0]}[], %s::{types[1]}[]))"
        )
        params = [array_literal(first for first, _ in pairs),
                  array_literal(second for _, second in pairs)]
        # IN never matches NULL: pairs whose second value is NULL match by IS NULL.
        nulls = [first for first, second in self.pairs if second is None]
        if nulls:
            sql = f"({sql} OR ({columns[0]} = ANY(%s::{types[0]}[]) AND {columns[1]} IS NULL))"
            params.append(array_literal(nulls))
        return sql, params


def array_literal(values) -> str:
    """Render values as a PostgreSQL array literal, every element quoted and escaped."""
    return "{" + ",".join(_element(value) for value in values) + "}"


def _element(value) -> str:
    if type(value) is int:
        return str(value)  # the common case: an integer key needs no quoting
    if value is None:
        return "NULL"
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ObservedText(Func):
    """A timestamptz as the text an items message carries: ISO-8601 in UTC with
    microseconds, as Python reads it, where Python can hold the value; otherwise
    PostgreSQL's own text (``-infinity``, ``infinity``, a BC or post-9999 instant),
    which PostgreSQL reads back exactly. NULL stays NULL."""

    template = (
        "CASE WHEN %(expressions)s >= '0001-01-01 00:00:00+00' "
        "AND %(expressions)s < '10000-01-01 00:00:00+00' "
        "THEN to_char(%(expressions)s AT TIME ZONE 'UTC', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"') "
        "ELSE (%(expressions)s)::text END"
    )
    output_field = CharField()


class Clamped(Func):
    """A timestamptz clamped into the years Python can hold (NULL stays NULL), for
    reading values such as ``-infinity`` back into a datetime."""

    template = (
        "CASE WHEN %(expressions)s < '0001-01-01 00:00:00+00' "
        "THEN '0001-01-01 00:00:00+00'::timestamptz "
        "WHEN %(expressions)s > '9999-12-31 23:59:59.999999+00' "
        "THEN '9999-12-31 23:59:59.999999+00'::timestamptz "
        "ELSE %(expressions)s END"
    )
    output_field = DateTimeField()


class MessageField(JSONField):
    """A JSONField that bulk-inserts through VALUES rows.

    Django 5.2 bulk-inserts on PostgreSQL through UNNEST of one array per column, and
    psycopg quotes each element of such an array in Python: for items messages (about
    100 KB each) that took 8.8 of the 14.4 s of dispatching a million holds. A
    placeholder per value keeps the VALUES form. (A field with a placeholder method of its
    own is never unnested: Django before 6.1 looks for get_placeholder, 6.1 on for
    get_placeholder_sql, and warns where a field has only the former.)
    """

    def get_placeholder(self, value, compiler, connection):
        return "%s"

    def get_placeholder_sql(self, value, compiler, connection):
        if hasattr(value, "as_sql"):
            return compiler.compile(value)
        return "%s", (value,)

