"""systemd's syntax, read as its own parser reads it, for `lastword doctor --unit`.

A unit's process is given only what systemd's parser keeps, so doctor reads the unit files the
same way: `[Section]`s and `Key=value` lines with their continuations (unit_lines), the words of
a line as extract_first_word() splits them, C escapes as cunescape() decodes them, paths as
path_simplify_and_warn() keeps them, credential IDs as credential_name_valid() accepts them,
the specifiers lastword's units use, and `EnvironmentFile=`s as env-file.c parses them. What
systemd refuses is refused here too, so that the caller can ignore the line (or the part of it)
with a note, as systemd does.
"""

from __future__ import annotations

import re
import socket
import string
from collections.abc import Iterator
from typing import Literal

# Linux's limits, which systemd checks names and paths against: a file name and a path.
NAME_MAX = 255
PATH_MAX = 4096
# What separates the words of an Environment= or StateDirectory= line (systemd's WHITESPACE).
WHITESPACE = " \t\n\r"
# A variable name systemd accepts in Environment= and env files.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# systemd's one-letter C escapes (cunescape_one(); "\s", a space, is its own).
_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}
# Its escapes by number: the letter and how many hex digits follow ("\101", octal, has none).
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}

# What a backslash does in a word (extract_first_word()): starts a C escape, keeps the next
# character as it is (the default), or is a character like any other (EXTRACT_RETAIN_ESCAPE).
Backslash = Literal["escape", "next", "keep"]


class BadSyntax(ValueError):
    """A value systemd's parser refuses (an unbalanced quote, an unknown escape): it ignores the
    line, or the rest of it."""


def unit_lines(text: str, section: str = "Service") -> list[tuple[int, str, str]]:
    """The `Key=value` lines of one section of a unit file, continuation lines joined, each
    with the number of the line it starts on."""
    lines: list[tuple[int, str, str]] = []
    current, pending, start = "", "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending and line[:1] in ("#", ";"):
            continue
        if not pending:
            start = number
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line:
            key, _, value = line.partition("=")
            lines.append((start, key.strip(), value.strip()))
    return lines


def _unescape_instance(text: str) -> str:
    # systemd-escape's inverse: "-" is "/", "\xNN" a byte.
    raw = text.replace("-", "/")
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda match: chr(int(match.group(1), 16)), raw)


def expand(text: str, unit: str) -> str:
    """The specifiers lastword's units use (%i %I %n %N %p %H %%); others are kept as written."""
    stem = unit.rsplit(".", 1)[0]
    prefix, _, instance = stem.partition("@")
    values = {
        "i": instance,
        "I": _unescape_instance(instance),
        "n": unit,
        "N": stem,
        "p": prefix,
        "H": socket.gethostname(),
        "%": "%",
    }
    return re.sub(r"%(.)", lambda match: values.get(match.group(1), match.group(0)), text)


def _unescape_one(text: str, at: int, *, nul: bool) -> tuple[bytes, int]:
    """The C escape whose letter is at `at` (just after a backslash), as systemd's
    cunescape_one() reads it: its bytes and how many characters it took. `nul`: whether it
    may be a NUL byte. BadSyntax on one systemd does not know."""
    letter = text[at]
    if letter in _ESCAPES:
        return _ESCAPES[letter].encode(), 1
    if letter in _HEX_ESCAPES:
        start, width, base, digits_allowed = at + 1, _HEX_ESCAPES[letter], 16, string.hexdigits
    elif letter in string.octdigits:
        start, width, base, digits_allowed = at, 3, 8, string.octdigits
    else:
        raise BadSyntax("an unknown escape")
    digits = text[start : start + width]
    if len(digits) < width or not all(char in digits_allowed for char in digits):
        raise BadSyntax("a malformed escape")
    value = int(digits, base)
    if value == 0 and not nul:
        raise BadSyntax("a NUL escape")
    used = start + width - at
    if letter == "U" and (value > 0x10FFFF or 0xD800 <= value <= 0xDFFF):
        raise BadSyntax("an escape of no character")
    if letter in "uU":
        # A lone surrogate from "\u" stays as systemd writes it, invalid UTF-8.
        return chr(value).encode(errors="surrogatepass"), used
    if value > 0xFF:
        raise BadSyntax("an octal escape over 255")
    return bytes([value]), used


def _first_word(
    text: str,
    separators: str,
    *,
    unquote: bool = False,
    backslash: Backslash = "next",
    coalesce: bool = True,
    nul: bool = False,
) -> tuple[bytes, str | None] | None:
    """The first word of `text` and what follows it (None at the end), as systemd's
    extract_first_word() splits it; None when there is none. `unquote`: quotes group and are
    removed; `coalesce`: a run of separators is one (else an empty word is one too); `nul`: an
    escape may be a NUL byte. BadSyntax on an unbalanced quote, a bad escape or a backslash at
    the end."""
    at, end = 0, len(text)
    if coalesce:
        while at < end and text[at] in separators:
            at += 1
        if at == end:
            return None
    word, quote = bytearray(), ""
    while at < end:
        char = text[at]
        if char == "\\" and backslash != "keep":
            if at + 1 == end:
                raise BadSyntax("a backslash at the end")
            if backslash == "escape":
                decoded, used = _unescape_one(text, at + 1, nul=nul)
            else:
                decoded, used = text[at + 1].encode(), 1
            word += decoded
            at += 1 + used
            continue
        at += 1
        if quote and char == quote:
            quote = ""
        elif not quote and unquote and char in "'\"":
            quote = char
        elif not quote and char in separators:
            if coalesce:
                while at < end and text[at] in separators:
                    at += 1
            return bytes(word), (text[at:] if at < end or not coalesce else None)
        else:
            word += char.encode()
    if quote:
        raise BadSyntax("an unbalanced quote")
    return bytes(word), None


def words(text: str, *, unquote: bool, backslash: Backslash) -> Iterator[bytes]:
    """Each word of a whitespace-separated line, as systemd splits it. The words before one
    that raises BadSyntax are yielded first: systemd has applied them too."""
    rest: str | None = text
    while rest is not None:
        found = _first_word(rest, WHITESPACE, unquote=unquote, backslash=backslash)
        if found is None:
            return
        word, rest = found
        yield word


def split_id(value: str) -> tuple[str, str | None]:
    """A credential line's ID and what follows its first `:` (None: there is no `:`), as
    systemd splits them. BadSyntax on a backslash at the end of the ID."""
    found = _first_word(value, ":", coalesce=False)
    word, rest = found if found else (b"", None)
    return word.decode(), rest


def cunescape(text: str) -> bytes:
    """systemd's cunescape() with NUL allowed, as it reads `SetCredential=` data: C escapes
    decoded, BadSyntax on one it does not know or a backslash at the end."""
    found = _first_word(text, "", backslash="escape", coalesce=False, nul=True)
    return found[0] if found else b""


def credential_name_valid(name: str) -> bool:
    """systemd's credential_name_valid(): a file name (not empty, `.` or `..`, no `/`, at most
    NAME_MAX bytes) that is also a valid fd name (printable ASCII, no `:`)."""
    return (
        name not in ("", ".", "..")
        and len(name) <= NAME_MAX
        and all(" " <= char <= "~" and char not in "/:" for char in name)
    )


def simplified(path: str, *, absolute: bool = True) -> str | None:
    """`path` as systemd's path_simplify_and_warn() keeps it: absolute (or relative), without
    `//`, `.` parts or a trailing `/`; None for one it refuses: the other kind, a `..` part, a
    name over NAME_MAX bytes, PATH_MAX bytes in all, or nothing at all."""
    if path.startswith("/") != absolute:
        return None
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts or any(len(part.encode()) > NAME_MAX for part in parts):
        return None
    simple = "/" * absolute + "/".join(parts)
    return simple if simple and len(simple.encode()) < PATH_MAX else None


def normalized(path: str) -> bool:
    """systemd's path_is_normalized(): no `.` or `..` part, no `//`, under PATH_MAX bytes."""
    return (
        "//" not in path
        and not {".", ".."} & set(path.split("/"))
        and len(path.encode()) < PATH_MAX
    )


def read_env_file(text: str) -> tuple[dict[str, str], list[str]]:
    """An `EnvironmentFile=` as systemd parses it (env-file.c): `KEY=VALUE` lines, `#`/`;`
    comments, single quotes literal, double quotes with backslash escapes, a backslash at the
    end of a line continuing it. Also the keys systemd ignores (`export X`, not a name)."""
    values: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in _env_assignments(text):
        if ENV_NAME.fullmatch(key):
            values[key] = value
        else:
            ignored.append(key)
    return values, ignored


def _env_assignments(text: str) -> Iterator[tuple[str, str]]:
    state, key, value = "pre_key", "", ""
    # Where the trailing blanks of an unquoted value begin; they are not part of it.
    blank_from: int | None = None
    for char in text + "\n":
        newline = char in "\n\r"
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif not char.isspace():
                state, key = "key", char
        elif state == "key":
            if newline:
                state = "pre_key"
            elif char == "=":
                state, key, value, blank_from = "pre_value", key.strip(), "", None
            else:
                key += char
        elif state == "comment":
            state = "pre_key" if newline else ("comment_escape" if char == "\\" else "comment")
        elif state == "comment_escape":
            state = "comment"
        elif state in ("pre_value", "value") and newline:
            yield key, value[:blank_from] if state == "value" else value
            state = "pre_key"
        elif state == "pre_value":
            if char in "'\"":
                state = "single" if char == "'" else "double"
            elif char == "\\":
                state = "value_escape"
            elif not char.isspace():
                state, value = "value", value + char
        elif state == "value":
            if char == "\\":
                state, blank_from = "value_escape", None
            else:
                if not char.isspace():
                    blank_from = None
                elif blank_from is None:
                    blank_from = len(value)
                value += char
        elif state == "value_escape":
            state, blank_from = "value", None
            if not newline:
                value += char
        elif state == "single":
            state, value = ("pre_value", value) if char == "'" else ("single", value + char)
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            if char in '"\\`$':
                value += char
            elif not newline:
                value += "\\" + char
    if state in ("single", "double", "double_escape"):
        # An unclosed quote at the end of the file: systemd keeps what it read.
        yield key, value
