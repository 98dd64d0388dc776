"""Decide whether hand-written SQL is one read-only statement, before it reaches the database.

A small tokenizer (pure, no dependencies) that follows the backend's own lexical rules where
they matter for hiding text: comments (``--``; ``/* */``, nested on PostgreSQL only), string
literals (``''`` doubling; ``E'\\''`` escapes and ``$tag$`` dollar quoting on PostgreSQL),
quoted identifiers (also ```x``` and ``[x]`` on SQLite). Words inside strings, comments and
quoted identifiers never count, and a ``;`` there never splits the text.

:func:`check_read_only` then accepts one SELECT / WITH / VALUES / EXPLAIN statement (and PRAGMA
on SQLite, which the SQLite authorizer narrows further) and refuses data-modifying words
anywhere (a data-modifying CTE), ``SELECT ... INTO``, row-locking clauses, EXPLAIN ANALYZE and
PostgreSQL functions that act outside the transaction. It is a gate in front of the database's
own read-only transaction, not a replacement for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TokenKind = Literal["word", "ident", "string", "number", "param", "punct"]

STARTS = ("select", "with", "values", "explain")
SQLITE_STARTS = (*STARTS, "pragma")
#: Words that may stand between EXPLAIN and its statement (option words; ANALYZE is refused).
EXPLAIN_OPTIONS = frozenset({"verbose", "query", "plan", "analyze", "analyse"})
MODIFYING_WORDS = frozenset({"insert", "update", "delete", "merge"})
#: Words that begin a statement on PostgreSQL or SQLite: any other first word is a typo (only
#: the wording of the refusal depends on this list).
COMMAND_WORDS = frozenset(
    [
        "abort",
        "alter",
        "analyse",
        "analyze",
        "attach",
        "begin",
        "call",
        "checkpoint",
        "close",
        "cluster",
        "comment",
        "commit",
        "copy",
        "create",
        "deallocate",
        "declare",
        "delete",
        "detach",
        "discard",
        "do",
        "drop",
        "end",
        "execute",
        "explain",
        "fetch",
        "grant",
        "import",
        "insert",
        "listen",
        "load",
        "lock",
        "merge",
        "move",
        "notify",
        "pragma",
        "prepare",
        "reassign",
        "refresh",
        "reindex",
        "release",
        "replace",
        "reset",
        "revoke",
        "rollback",
        "savepoint",
        "security",
        "select",
        "set",
        "show",
        "start",
        "table",
        "truncate",
        "unlisten",
        "update",
        "vacuum",
        "values",
        "with",
    ]
)
#: PostgreSQL functions that read or write server files, signal or reconfigure the server,
#: take session locks, change settings or run SQL text this check never saw.
REFUSED_FUNCTIONS = frozenset(
    {
        "pg_read_file",
        "pg_read_binary_file",
        "pg_stat_file",
        "pg_logdir_ls",
        "pg_terminate_backend",
        "pg_cancel_backend",
        "pg_reload_conf",
        "pg_rotate_logfile",
        "pg_promote",
        "pg_log_backend_memory_contexts",
        "pg_switch_wal",
        "pg_start_backup",
        "pg_stop_backup",
        "pg_import_system_collations",
        "pg_notify",
        "set_config",
        "ts_stat",
        "ts_rewrite",
        "cursor_to_xml",
        "cursor_to_xmlschema",
        "lo_import",
        "lo_export",
        "lo_put",
        "lo_from_bytea",
        "lo_create",
        "lo_creat",
        "lo_unlink",
        "lo_open",
        "lowrite",
        "lo_truncate",
        "lo_truncate64",
    }
)
REFUSED_FUNCTION_PREFIXES = (
    "pg_ls_",
    "pg_file_",
    "pg_stat_reset",
    "pg_create_",
    "pg_drop_replication",
    "pg_copy_",
    "pg_replication_",
    "pg_logical_",
    "pg_wal_replay_",
    "pg_backup_",
    "pg_advisory_",
    "pg_try_advisory_",
    "dblink",
    "query_to_xml",
)
_DOLLAR_TAG = re.compile(r"\$(?:[^\W\d$][^\W$]*)?\$")
_PARAM = re.compile(r"\$\w*")


class QueryRefused(Exception):
    """``query`` will not run this statement (or not on this connection); the text says why."""


class NotAStatement(QueryRefused):
    """The text does not begin like any SQL statement (a typo, most likely)."""


@dataclass(frozen=True)
class Token:
    """One lexical token: a word (lowercased), a quoted identifier (its value), a string
    literal, number or parameter (as written), or one punctuation character."""

    kind: TokenKind
    text: str


@dataclass(frozen=True)
class Dialect:
    """The lexical rules that differ between the backends."""

    nested_comments: bool
    dollar_quotes: bool
    escape_strings: bool
    sqlite_identifiers: bool


DIALECTS = {
    "postgresql": Dialect(True, True, True, False),
    "sqlite": Dialect(False, False, False, True),
}


def check_read_only(sql: str, dialect: str) -> None:
    """Raise QueryRefused unless ``sql`` is one read-only statement for ``dialect``."""
    if dialect not in DIALECTS:
        raise QueryRefused(f"'query' supports SQLite and PostgreSQL stores only, not {dialect}")
    statement = _single_statement(tokenize(sql, dialect))
    _check_start(statement, SQLITE_STARTS if dialect == "sqlite" else STARTS)
    _check_words(statement)


def tokenize(sql: str, dialect: str) -> list[Token]:
    """Split ``sql`` into tokens by ``dialect``'s rules, dropping whitespace and comments.

    Raises QueryRefused for an unterminated string, identifier or comment, and for PostgreSQL
    ``U&"..."`` identifiers (their escapes could spell any name).
    """
    rules = DIALECTS[dialect]
    tokens: list[Token] = []
    i = 0
    while i < len(sql):
        char = sql[i]
        if char.isspace():
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end + 1
        elif sql.startswith("/*", i):
            i = _comment_end(sql, i, rules.nested_comments)
        else:
            token, i = _next_token(sql, i, rules)
            tokens.append(token)
    return tokens


def _next_token(sql: str, i: int, rules: Dialect) -> tuple[Token, int]:
    """Return the token starting at ``sql[i]`` (not a space or comment) and where it ends."""
    char = sql[i]
    if char == "'":
        end = _quoted_end(sql, i, "'", backslash=False)
        return Token("string", sql[i:end]), end
    if char == '"' or (rules.sqlite_identifiers and char in "`["):
        close = "]" if char == "[" else char
        end = _quoted_end(sql, i, close, backslash=False)
        return Token("ident", sql[i + 1 : end - 1].replace(close * 2, close)), end
    if char == "$" and rules.dollar_quotes and (tag := _DOLLAR_TAG.match(sql, i)):
        close = sql.find(tag.group(), tag.end())
        if close < 0:
            raise QueryRefused("the SQL has an unterminated dollar-quoted string")
        end = close + len(tag.group())
        return Token("string", sql[i:end]), end
    if char == "$":
        end = _PARAM.match(sql, i).end()  # type: ignore[union-attr]
        return Token("param", sql[i:end]), end
    if char.isalpha() or char == "_":
        return _word(sql, i, rules)
    if char.isdigit() or (char == "." and sql[i + 1 : i + 2].isdigit()):
        end = i
        while end < len(sql) and (sql[end].isalnum() or sql[end] in "._"):
            end += 1
        return Token("number", sql[i:end]), end
    return Token("punct", char), i + 1


def _word(sql: str, i: int, rules: Dialect) -> tuple[Token, int]:
    """Return a word (or an ``E'...'`` escape string, which starts like one) at ``sql[i]``."""
    end = i
    while end < len(sql) and (sql[end].isalnum() or sql[end] in "_$"):
        end += 1
    word = sql[i:end].lower()
    if rules.escape_strings and word == "e" and sql[end : end + 1] == "'":
        close = _quoted_end(sql, end, "'", backslash=True)
        return Token("string", sql[i:close]), close
    if rules.dollar_quotes and word == "u" and sql[end : end + 2] == '&"':
        raise QueryRefused("U&\"...\" identifiers are not accepted in 'query'; write the name")
    return Token("word", word), end


def _quoted_end(sql: str, start: int, close: str, backslash: bool) -> int:
    """Return the index after the quote closing the literal opened at ``sql[start]``.

    A doubled closing quote stays inside; with ``backslash`` a backslash escapes what follows.
    """
    i = start + 1
    while i < len(sql):
        if backslash and sql[i] == "\\":
            i += 2
        elif sql[i] == close:
            if sql[i + 1 : i + 2] != close:
                return i + 1
            i += 2
        else:
            i += 1
    raise QueryRefused(f"the SQL has an unterminated quoted string or identifier ({close})")


def _comment_end(sql: str, start: int, nested: bool) -> int:
    """Return the index after the ``/* ... */`` comment opened at ``sql[start]``."""
    depth, i = 1, start + 2
    while i < len(sql):
        if sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        elif nested and sql.startswith("/*", i):
            depth += 1
            i += 2
        else:
            i += 1
    raise QueryRefused("the SQL has an unterminated /* comment")


def _single_statement(tokens: Sequence[Token]) -> list[Token]:
    """Return the tokens of the one statement in ``tokens`` (trailing ``;`` allowed)."""
    statements: list[list[Token]] = [[]]
    for token in tokens:
        if token == Token("punct", ";"):
            statements.append([])
        else:
            statements[-1].append(token)
    found = [statement for statement in statements if statement]
    if not found:
        raise QueryRefused("there is no SQL statement to run")
    if len(found) > 1:
        raise QueryRefused(
            f"'query' runs one statement at a time; this SQL holds {len(found)} "
            "(a ';' outside quotes and comments ends a statement)"
        )
    return found[0]


def _check_start(tokens: Sequence[Token], starts: Sequence[str]) -> None:
    """Refuse a statement that does not begin with one of ``starts`` (EXPLAIN: its target)."""
    rest = _skip_parentheses_open(tokens)
    if rest and rest[0] == Token("word", "explain"):
        _refuse_analyze(rest)
        rest = _explained(rest[1:])
        starts = [start for start in starts if start not in ("explain", "pragma")]
    if rest and rest[0].kind == "word" and rest[0].text in starts:
        return
    first = rest[0].text if rest else ""
    shown = ", ".join(start.upper() for start in starts)
    if first not in COMMAND_WORDS:
        raise NotAStatement(
            f"syntax error at or near {first!r}: a statement for 'query' starts with {shown}"
        )
    raise QueryRefused(
        f"'query' runs one read-only statement ({shown}); this one starts with {first.upper()}"
    )


def _skip_parentheses_open(tokens: Sequence[Token]) -> Sequence[Token]:
    """Return ``tokens`` without the opening parentheses in front (``(SELECT 1) UNION ...``)."""
    i = 0
    while i < len(tokens) and tokens[i] == Token("punct", "("):
        i += 1
    return tokens[i:]


def _explained(tokens: Sequence[Token]) -> Sequence[Token]:
    """Return the statement after EXPLAIN's options (a parenthesised list and option words)."""
    i, depth = 0, 0
    while i < len(tokens) and tokens[0] == Token("punct", "("):
        depth += {"(": 1, ")": -1}.get(tokens[i].text, 0) if tokens[i].kind == "punct" else 0
        i += 1
        if depth == 0:
            break
    while i < len(tokens) and tokens[i].kind == "word" and tokens[i].text in EXPLAIN_OPTIONS:
        i += 1
    return _skip_parentheses_open(tokens[i:])


def _check_words(tokens: Sequence[Token]) -> None:
    """Refuse locking clauses, data-modifying words, INTO, ANALYZE and outside-acting calls."""
    words = [token.text if token.kind == "word" else "" for token in tokens]
    for i, word in enumerate(words):
        if word == "for" and words[i + 1 : i + 2] in (["update"], ["share"], ["no"], ["key"]):
            raise QueryRefused(
                "SELECT ... FOR UPDATE / FOR SHARE takes row locks that block writers; "
                "'query' only reads, so leave the locking clause out"
            )
        if word in MODIFYING_WORDS:
            raise QueryRefused(
                f"{word.upper()} modifies data and 'query' only reads (a column named "
                f'{word} can be written in double quotes: "{word}")'
            )
        if word == "into":
            raise QueryRefused("SELECT ... INTO creates a table and 'query' only reads")
    _refuse_analyze(tokens)
    for token in tokens:
        name = token.text.lower()
        if token.kind in ("word", "ident") and _refused_function(name):
            raise QueryRefused(
                f"{name}() acts outside the read-only transaction (server files, other "
                "sessions, server settings or SQL text run unchecked), so 'query' refuses it"
            )


def _refuse_analyze(tokens: Sequence[Token]) -> None:
    """Refuse ANALYZE / ANALYSE anywhere (a reserved word: only EXPLAIN's option or the
    statement)."""
    for token in tokens:
        if token.kind == "word" and token.text in ("analyze", "analyse"):
            raise QueryRefused(
                f"EXPLAIN {token.text.upper()} runs the statement it explains; use EXPLAIN "
                "without it"
            )


def _refused_function(name: str) -> bool:
    """Whether ``name`` is a PostgreSQL function ``query`` refuses."""
    return name in REFUSED_FUNCTIONS or name.startswith(REFUSED_FUNCTION_PREFIXES)
