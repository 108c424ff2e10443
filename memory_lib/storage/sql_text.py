"""The SQL of a migration without its comments: what a migration's checksum covers.

A comment is not part of a migration's meaning, so a stale path or a reworded explanation in one can be
fixed after the migration shipped. `sql_without_comments` scans the text as PostgreSQL's lexer does:
string constants ('...', E'...' with backslash escapes), quoted identifiers ("...") and dollar-quoted
bodies ($$...$$, $tag$...$tag$) are copied byte for byte, comments inside them included (a function body
is stored in the database as written); outside them `--` line comments and `/* */` block comments (which
nest) are dropped. Whitespace outside those literals is collapsed: a run holding a line break becomes one
newline (PostgreSQL joins two string constants only across a line break), any other run one space.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

# A dollar-quote delimiter: $$ or $tag$, the tag an identifier without `$` (a `$1` parameter is not one).
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_WHITESPACE = " \t\n\r\f\v"


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$" or ord(ch) >= 0x80


def _end_of_quoted(sql: str, start: int, quote: str, *, backslashes: bool) -> int:
    """The index just past the literal opened by sql[start] (`quote`); a doubled quote stays inside, and
    with `backslashes` (E'...') so does a backslash-escaped character. The end of the text when unclosed."""
    i = start + 1
    while i < len(sql):
        ch = sql[i]
        if backslashes and ch == "\\":
            i += 2
            continue
        if ch == quote:
            if i + 1 < len(sql) and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def _end_of_block_comment(sql: str, start: int) -> int:
    """The index just past the /* */ comment opened at `start`; PostgreSQL's block comments nest."""
    depth, i = 0, start
    while i < len(sql):
        pair = sql[i : i + 2]
        if pair == "/*":
            depth, i = depth + 1, i + 2
        elif pair == "*/":
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(sql)


def _tokens(sql: str) -> Iterator[tuple[str, int, int]]:
    """The text as PostgreSQL's lexer sees it, in order: ("space" | "comment" | "literal" | "char",
    start, end). A literal (string, quoted identifier, dollar-quoted body) is one token, comments in it
    included; "char" is one character of anything else."""
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in _WHITESPACE:
            kind, end = "space", i + 1
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            kind, end = "comment", n if newline < 0 else newline  # the line break itself is whitespace
        elif sql.startswith("/*", i):
            kind, end = "comment", _end_of_block_comment(sql, i)
        elif ch in "'\"":
            prefix = sql[i - 1] if i else ""
            escapes = (
                ch == "'" and prefix in "Ee" and prefix != "" and (i < 2 or not _is_ident_char(sql[i - 2]))
            )
            kind, end = "literal", _end_of_quoted(sql, i, ch, backslashes=escapes)
        elif ch == "$" and (i == 0 or not _is_ident_char(sql[i - 1])) and (tag := _DOLLAR_TAG.match(sql, i)):
            close = sql.find(tag.group(0), tag.end())
            kind, end = "literal", n if close < 0 else close + len(tag.group(0))
        else:
            kind, end = "char", i + 1
        yield kind, i, end
        i = end


def sql_without_comments(sql: str) -> str:
    """`sql` without its comments, whitespace outside literals collapsed (see the module docstring)."""
    out: list[str] = []
    pending = ""  # whitespace seen since the last token: "", " " or "\n"
    for kind, start, end in _tokens(sql):
        if kind == "space" or kind == "comment":
            gap = "\n" if kind == "space" and sql[start] in "\n\r" else " "
            if gap == "\n" or not pending:
                pending = gap
            continue
        if pending and out:
            out.append(pending)
        pending = ""
        out.append(sql[start:end])
    return "".join(out)


def sql_statements(sql: str) -> list[str]:
    """`sql` cut into its statements at the semicolons outside literals and comments, each as written,
    comments kept; a piece holding only comments is dropped. Distributed Postgres (Citus) forwards some
    statements to its workers as the text the client sent, which must then be one statement. A
    `BEGIN ATOMIC` function body would be cut: none is used."""
    cuts = [end for kind, start, end in _tokens(sql) if kind == "char" and sql[start] == ";"]
    pieces = [sql[a:b] for a, b in zip([0, *cuts], [*cuts, len(sql)], strict=True)]
    return [s.strip() for s in pieces if sql_without_comments(s).strip(_WHITESPACE + ";")]


def sql_checksum(sql: str) -> str:
    """sha256 of `sql` without its comments: the same for two texts that differ only in comments or in
    whitespace outside literals, different when a statement, literal or function body differs."""
    return hashlib.sha256(sql_without_comments(sql).encode()).hexdigest()


def full_text_checksum(sql: str) -> str:
    """sha256 of the whole text, comments included: what the migration runner recorded before its
    checksums left comments out (storage.migrations re-records such a checksum once)."""
    return hashlib.sha256(sql.encode()).hexdigest()
