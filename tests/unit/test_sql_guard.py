"""The pure statement classifier behind ``query``: one read-only statement, or a refusal.

It must see through comments (nested ones on PostgreSQL, flat ones on SQLite), string
literals, escape strings, dollar quoting and quoted identifiers, so neither a hidden second
statement nor a harmless word inside a string decides the answer.
"""

from __future__ import annotations

import pytest

from orchestrator.store.sql_guard import QueryRefused, check_read_only, tokenize

ALLOWED_PG = [
    "SELECT 1",
    "select 1;",
    "  -- a comment first\nSELECT 1 -- and one after",
    "/* lead */ SELECT 1 /* trail ; */ ;  -- end",
    "WITH x AS (SELECT 1 AS n) SELECT * FROM x",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
    "VALUES (1, 'a'), (2, 'b')",
    "(SELECT 1) UNION (SELECT 2)",
    "EXPLAIN SELECT * FROM trials",
    "EXPLAIN (FORMAT JSON, COSTS OFF) SELECT * FROM trials",
    "EXPLAIN VERBOSE WITH x AS (SELECT 1) SELECT * FROM x",
    "SELECT ';' AS semicolon",
    "SELECT 'DELETE FROM trials; UPDATE x' AS text",
    "SELECT $$; DELETE FROM trials$$",
    "SELECT $tag$ it's $$ ; DELETE $tag$",
    "SELECT E'\\'; DELETE FROM trials; --'",
    "SELECT 1 /* outer /* inner ; */ still comment ; DELETE */",
    'SELECT "delete", "into" FROM trials',
    "SELECT substring('abcdef' FOR 2)",
    "SELECT pg_sleep(0.01)",
    "SELECT a$b FROM trials WHERE x = $1",
]


@pytest.mark.parametrize("sql", ALLOWED_PG)
def test_read_only_statements_pass_on_postgresql(sql: str) -> None:
    check_read_only(sql, "postgresql")


REFUSED_PG = [
    ("", "no SQL statement"),
    ("  -- only a comment\n", "no SQL statement"),
    ("SELECT 1; DELETE FROM trials", "one statement"),
    ("SELECT 1 -- harmless\n; DELETE FROM trials", "one statement"),
    ("SELECT 'a'';' ; DELETE FROM trials", "one statement"),
    ("SELECT 1 /* /* */ ; still comment */ ; DELETE FROM trials", "one statement"),
    ("SELECT $x$ $$ ; $x$; DELETE FROM trials", "one statement"),
    ("DELETE FROM trials", "starts with DELETE"),
    ("UPDATE trials SET status = 'failed'", "starts with UPDATE"),
    ("COPY (SELECT 1) TO PROGRAM 'id > owned.txt'", "starts with COPY"),
    ("COPY trials TO '/tmp/trials.csv'", "starts with COPY"),
    ("DO $$BEGIN DELETE FROM trials; END$$", "starts with DO"),
    ("SET ROLE postgres", "starts with SET"),
    ("SET TRANSACTION READ WRITE", "starts with SET"),
    ("LOCK TABLE trials IN ACCESS EXCLUSIVE MODE", "starts with LOCK"),
    ("CALL anything()", "starts with CALL"),
    ("SELEC policy FROM trials", "syntax error at or near 'selec'"),
    ("(DELETE FROM trials)", "starts with DELETE"),
    ("WITH gone AS (DELETE FROM trials RETURNING 1) SELECT count(*) FROM gone", "DELETE"),
    ("WITH x AS (UPDATE trials SET status = 'x' RETURNING 1) SELECT 1", "UPDATE"),
    ("WITH x AS (SELECT 1) INSERT INTO sweeps SELECT * FROM x", "INSERT"),
    ("SELECT * INTO stolen FROM trials", "INTO"),
    ("SELECT * FROM trials FOR UPDATE", "row locks"),
    ("SELECT * FROM trials FOR NO KEY UPDATE", "row locks"),
    ("SELECT * FROM trials FOR SHARE", "row locks"),
    ("SELECT * FROM trials t FOR KEY SHARE OF t", "row locks"),
    ("EXPLAIN ANALYZE DELETE FROM trials", "ANALYZE"),
    ("EXPLAIN ANALYZE SELECT 1", "ANALYZE"),
    ("EXPLAIN (ANALYZE) DELETE FROM trials", "ANALYZE"),
    ("EXPLAIN (costs off, analyse true) SELECT 1", "ANALYSE"),
    ("EXPLAIN DELETE FROM trials", "DELETE"),
    ("SELECT pg_read_file('/etc/passwd')", "pg_read_file"),
    ("SELECT pg_catalog.pg_terminate_backend(1)", "pg_terminate_backend"),
    ('SELECT "pg_reload_conf"()', "pg_reload_conf"),
    ("SELECT set_config('role', 'postgres', false)", "set_config"),
    ("SELECT query_to_xml('select 1', true, true, '')", "query_to_xml"),
    ("SELECT lo_export(1, '/tmp/x')", "lo_export"),
    ("SELECT * FROM dblink('x', 'select 1') AS t(a int)", "dblink"),
    ("SELECT pg_advisory_lock(1)", "pg_advisory_lock"),
    ("SELECT U&\"\\0070g_read_file\"('/etc/passwd')", "U&"),
    ("SELECT 'abc", "unterminated"),
    ("SELECT $$abc", "unterminated"),
    ("SELECT 1 /* /* */", "unterminated"),
    ('SELECT "abc', "unterminated"),
]


@pytest.mark.parametrize(("sql", "reason"), REFUSED_PG)
def test_everything_else_is_refused_on_postgresql_with_the_reason(sql: str, reason: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_read_only(sql, "postgresql")
    assert reason.lower() in str(refused.value).lower(), (sql, str(refused.value))


ALLOWED_SQLITE = [
    "SELECT 1",
    "PRAGMA table_info(trials)",
    "EXPLAIN QUERY PLAN SELECT * FROM trials",
    "SELECT [delete], `into` FROM trials",
    "SELECT 'it''s ; DELETE'",
    "SELECT x'00ff'",
]


@pytest.mark.parametrize("sql", ALLOWED_SQLITE)
def test_read_only_statements_pass_on_sqlite(sql: str) -> None:
    check_read_only(sql, "sqlite")


REFUSED_SQLITE = [
    # SQLite's comments do not nest: the statement goes on after the first */.
    ("SELECT 1 /* /* */ ; DELETE FROM trials", "one statement"),
    ("VACUUM INTO 'copy.db'", "starts with VACUUM"),
    ("ATTACH DATABASE 'other.db' AS other", "starts with ATTACH"),
    ("SELECT [x FROM trials", "unterminated"),
    ("SELECT 1 FROM trials; PRAGMA query_only = OFF", "one statement"),
]


@pytest.mark.parametrize(("sql", "reason"), REFUSED_SQLITE)
def test_everything_else_is_refused_on_sqlite(sql: str, reason: str) -> None:
    with pytest.raises(QueryRefused) as refused:
        check_read_only(sql, "sqlite")
    assert reason.lower() in str(refused.value).lower(), (sql, str(refused.value))


def test_a_backend_without_rules_is_refused() -> None:
    with pytest.raises(QueryRefused, match="SQLite and PostgreSQL"):
        check_read_only("SELECT 1", "mysql")


def test_tokens_keep_strings_and_identifiers_apart_from_words() -> None:
    tokens = tokenize("SELECT \"Delete\", 'x;y', $q$a$q$ /* c */ FROM t -- end", "postgresql")
    assert [(t.kind, t.text) for t in tokens] == [
        ("word", "select"),
        ("ident", "Delete"),
        ("punct", ","),
        ("string", "'x;y'"),
        ("punct", ","),
        ("string", "$q$a$q$"),
        ("word", "from"),
        ("word", "t"),
    ]
