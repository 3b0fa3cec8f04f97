"""ORM expressions the engine's statements are built from."""

from __future__ import annotations

from django.db.models import BooleanField, CharField, Expression, F, Func


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
        columns, params = [], []
        for column in self.columns:
            sql, column_params = compiler.compile(column)
            columns.append(sql)
            params.extend(column_params)
        types = [column.output_field.db_type(connection) for column in self.columns]
        # AutoFields report "bigserial"-like types only when created; compare as bigint.
        types = [t.replace("bigserial", "bigint").replace("serial", "integer") for t in types]
        params.append(array_literal(first for first, _ in self.pairs))
        params.append(array_literal(second for _, second in self.pairs))
        return (
            f"({columns[0]}, {columns[1]}) IN "
            f"(SELECT * FROM unnest(%s::{types[0]}[], %s::{types[1]}[]))",
            params,
        )


def array_literal(values) -> str:
    """Render values as a PostgreSQL array literal, every element quoted and escaped."""
    return "{" + ",".join(_element(value) for value in values) + "}"


def _element(value) -> str:
    if value is None:
        return "NULL"
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class IsoTimestamp(Func):
    """A timestamptz as ISO-8601 text in UTC with microseconds, as Python reads it."""

    template = (
        "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"
    )
    output_field = CharField()
