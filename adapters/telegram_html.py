"""The LLM's Markdown rendered as Telegram HTML, with a plain-text fallback.

LLMs answer in Markdown, but Telegram shows Markdown literally unless it is sent with a parse
mode. Telegram's own "MarkdownV2" mode rejects any unescaped `_*[]()~>#+-=|{}.!` and so fails
on ordinary prose; its HTML mode only needs `<`, `>` and `&` escaped. So the reply is
converted here into the small HTML subset Telegram accepts
(https://core.telegram.org/bots/api#html-style): <b>, <i>, <s>, <code>, <pre>,
<pre><code class="language-x">, <a href> and <blockquote>, with only the &lt; &gt; &amp; and
&quot; entities. The output is well-formed by construction: the Markdown is parsed into a tree
first and only then printed, so every tag is closed and properly nested.

Supported: fenced code blocks, inline code, **bold** / __bold__, *italic* / _italic_,
~~strike~~, [text](url) links (http, https, tg and mailto only; other schemes keep just the
text), headings (a bold line), bullet lists ("• item"), numbered lists (kept as text) and
"> " blockquotes. Anything else, and every marker that does not pair up, stays literal text.
Emphasis opens only after a non-alphanumeric character and closes only before one, so
snake_case names and 2*3*4 stay as written.

`plain_text` is the same reply with the rendered markers removed and no HTML, for when
Telegram still rejects the entities ("can't parse entities"): the reply is never lost.

Length: the core splits a reply with `bot.outbound.split.split_message` BEFORE the adapter renders
it, so these functions run per part, and a part's HTML is longer than its Markdown (tags, entities).
`render_part` therefore sends HTML only when the HTML itself fits the limit (a conservative test:
Telegram counts the text after entity parsing), and otherwise the part's plain text, which is never
longer than its Markdown. Telegram counts UTF-16 code units (`utf16_len`) while `split_message`
counts code points, so a part full of emoji can still be too long even as plain text; `render_part`
raises ValueError then rather than truncating.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

TELEGRAM_LIMIT = 4096

# Schemes Telegram opens safely; anything else (javascript:, data:, relative paths) would be
# rejected by Telegram or be a trap for the user, so such links keep only their text.
_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")
# A backslash before one of these shows the character itself, as in Markdown.
_ESCAPABLE = frozenset("\\`*_~[]()#+-.!>|")
_EMPHASIS = {"**": "b", "__": "b", "*": "i", "_": "i", "~~": "s"}

_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^(\s*)[-*+][ \t]+(.*)$")
_RULE = re.compile(r"^\s*([-*_])(?:\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^ {0,3}> ?(.*)$")
_FENCE = re.compile(r"^\s*(`{3,})(.*)$")
# Only tidy language names go into the class attribute; others leave the block untagged.
_LANGUAGE = re.compile(r"[\w#+.-]{1,32}")
# Where inline markup may start: an escape, code, a link, emphasis, a bare URL ("h"). What
# lies between two of these is plain text, taken as one run (`_parse_inline`).
_INLINE_START = re.compile(r"[\\`\[*_~h]")


@dataclass
class _Node:
    """An element: tag is b, i, s, code, a, pre or blockquote. `attr` is an a's href or a
    pre's language."""

    tag: str
    children: list[_Node | str] = field(default_factory=list)
    attr: str | None = None


_Pieces = list[_Node | str]


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's limits: characters outside the
    Basic Multilingual Plane (most emoji) count 2."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def to_telegram_html(markdown: str) -> str:
    """`markdown` as Telegram HTML (parse_mode="HTML"), always well-formed."""
    return "".join(_html(piece) for piece in _parse(markdown))


def plain_text(markdown: str) -> str:
    """`markdown` as plain text (no parse mode): rendered markers removed, code kept, a link
    shown as "text (url)". Never longer than `markdown`."""
    return "".join(_plain(piece) for piece in _parse(markdown))


def render_part(markdown: str, limit: int = TELEGRAM_LIMIT) -> tuple[str, str | None]:
    """One part of a split reply as (text, parse_mode) for sendMessage: the HTML with "HTML"
    if it fits `limit` UTF-16 units, else the plain text with None. Raises ValueError if even
    the plain text does not fit; parts from `split_message(text, limit)` without characters
    outside the BMP always fit, since plain text is never longer than the Markdown. A blank
    part (split_message never makes one) is a ValueError too: Telegram rejects empty text."""
    html = to_telegram_html(markdown)
    if html.strip() and utf16_len(html) <= limit:
        return html, "HTML"
    text = plain_text(markdown)
    if not text.strip():
        raise ValueError("nothing to send: the part is blank")
    if utf16_len(text) > limit:
        raise ValueError(f"part is {utf16_len(text)} UTF-16 units even as plain text (> {limit})")
    return text, None


# Printing


def render_draft(markdown: str, limit: int) -> tuple[str, str | None]:
    """A draft of a reply still being written: its first `limit` characters (marked as
    going on), as HTML when the prefix renders to well-formed HTML, else as plain text. A
    prefix cut mid-token ("**bol", "```py") must never reach Telegram as broken HTML."""
    if len(markdown) > limit:
        markdown = markdown[:limit] + "…"
    html = to_telegram_html(markdown)
    if html.strip() and utf16_len(html) <= TELEGRAM_LIMIT and well_formed(html):
        return html, "HTML"
    return plain_text(markdown)[:limit], None


def well_formed(html: str) -> bool:
    """Every tag closed, in the order it was opened, and nothing the parser rejects."""
    checker = _TagChecker()
    try:
        checker.feed(html)
        checker.close()
    except ValueError:
        return False
    return checker.ok and not checker.open


class _TagChecker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.ok = True

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.ok = False


def _escape(text: str, quote: bool = False) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace('"', "&quot;") if quote else text


def _html(piece: _Node | str) -> str:
    if isinstance(piece, str):
        return _escape(piece)
    inner = "".join(_html(child) for child in piece.children)
    if piece.tag == "a":
        return f'<a href="{_escape(piece.attr or "", quote=True)}">{inner}</a>'
    if piece.tag == "pre" and piece.attr:
        return f'<pre><code class="language-{_escape(piece.attr, quote=True)}">{inner}</code></pre>'
    return f"<{piece.tag}>{inner}</{piece.tag}>"


def _plain(piece: _Node | str) -> str:
    if isinstance(piece, str):
        return piece
    inner = "".join(_plain(child) for child in piece.children)
    if piece.tag == "a" and piece.attr and piece.attr != inner:
        # Plain text has no links; keep the target visible (Telegram auto-links it).
        return f"{inner} ({piece.attr})" if inner.strip() else piece.attr
    return inner


# Blocks: code fences, quotes, headings and lists are line-based.


def _parse(markdown: str) -> _Pieces:
    lines = markdown.replace("\r\n", "\n").split("\n")
    out: _Pieces = []
    i = 0
    while i < len(lines):
        if out:
            out.append("\n")
        fence = _FENCE.match(lines[i])
        if fence:
            i = _parse_fence(lines, i, fence, out)
            continue
        if _QUOTE.match(lines[i]):
            quoted: _Pieces = []
            first = i
            while i < len(lines) and (m := _QUOTE.match(lines[i])):
                if quoted:
                    quoted.append("\n")
                quoted.extend(_parse_line(m.group(1)))
                i += 1
            # Telegram rejects an empty entity: a quote of blank lines is shown as written.
            if "".join(_plain(p) for p in quoted).strip():
                out.append(_Node("blockquote", quoted))
            else:
                out.append("\n".join(lines[first:i]))
            continue
        out.extend(_parse_line(lines[i]))
        i += 1
    if out and out[-1] == "\n":
        out.pop()
    return out


def _parse_fence(lines: list[str], start: int, fence: re.Match[str], out: _Pieces) -> int:
    """Append the code block opening at `start`; return the index after its closing fence.
    A block left open runs to the end, as in CommonMark (split_message closes every block of
    a part it cuts, so this only happens with Markdown that was broken to begin with)."""
    ticks, info = fence.group(1), fence.group(2).strip()
    words = info.split()
    language = words[0] if words and _LANGUAGE.fullmatch(words[0]) else None
    end = start + 1
    while end < len(lines):
        closing = lines[end].strip()
        # A closer is a bare run of at least as many backticks; "```js" inside is content.
        if len(closing) >= len(ticks) and closing == "`" * len(closing):
            break
        end += 1
    code = "\n".join(lines[start + 1 : end])
    if code:
        out.append(_Node("pre", [code], language))
    else:
        # Telegram rejects an empty entity, and the fences alone may be the whole part: an
        # empty block is shown as written.
        out.append("\n".join(lines[start : end + 1]))
    return end + 1


def _parse_line(line: str) -> _Pieces:
    if _RULE.match(line):
        return [line]
    heading = _HEADING.match(line)
    if heading:
        return [_Node("b", _parse_inline(heading.group(1)))]
    bullet = _BULLET.match(line)
    if bullet:
        return [bullet.group(1) + "• ", *_parse_inline(bullet.group(2))]
    return _parse_inline(line)


# Inline: code spans, links and emphasis within one line.


def _run(text: str, i: int) -> int:
    """Length of the run of text[i] starting at i."""
    j = i
    while j < len(text) and text[j] == text[i]:
        j += 1
    return j - i


def _code_span(text: str, i: int) -> tuple[str, int] | None:
    """(content, end) of the code span opening at i: closed by a run of exactly as many
    backticks."""
    ticks = _run(text, i)
    j = i + ticks
    while (j := text.find("`", j)) != -1:
        run = _run(text, j)
        if run == ticks:
            content = text[i + ticks : j]
            if not content.strip():
                return None
            if len(content) > 2 and content[0] == content[-1] == " ":
                content = content[1:-1]  # `` `x` `` shows `x`, as in CommonMark.
            return content, j + run
        j += run
    return None


def _link(text: str, i: int) -> tuple[str, str, int] | None:
    """(text, url, end) of the [text](url) starting at i."""
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 1
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                break
        j += 1
    if j >= len(text) or not text.startswith("(", j + 1):
        return None
    label_end, j, depth = j, j + 2, 0
    while j < len(text):
        ch = text[j]
        if ch.isspace():
            return None
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                url = text[label_end + 2 : j]
                return (text[i + 1 : label_end], url, j + 1) if url else None
            depth -= 1
        j += 1
    return None


def _emphasis(text: str, i: int) -> tuple[str, str, int] | None:
    """(tag, inner text, end) of the emphasis opening at i, or None if the markers there do
    not pair up (they then stay literal)."""
    marker = text[i]
    run = _run(text, i)
    if i > 0 and text[i - 1].isalnum():
        return None  # snake_case, 2*3*4: intraword markers are literal.
    if i + run >= len(text) or text[i + run].isspace():
        return None  # "a * b": an opener must touch the text it marks.
    for size in (2, 1):
        delimiter = marker * size
        if size > run or delimiter not in _EMPHASIS:
            continue
        j = i + run
        while j < len(text):
            ch = text[j]
            if ch == "\\":
                j += 2
                continue
            if ch == "`":
                span = _code_span(text, j)
                j = span[1] if span else j + _run(text, j)
                continue
            if ch != marker:
                j += 1
                continue
            close = _run(text, j)
            end = j + close
            # A run of exactly 2 closes bold, not italic: "*a **b** c*" stays one italic.
            fits = close >= 2 if size == 2 else close != 2
            # The closer must end a word too; "__init__.py" is a file name, not bold "init".
            after = text[end : end + 2]
            closes = not text[j - 1].isspace() and not (
                after[:1].isalnum() or (after[:1] in "._" and after[1:].isalnum())
            )
            inner = text[i + size : end - size]
            if fits and closes and inner.strip():
                return _EMPHASIS[delimiter], inner, end
            j = end
    return None


def _parse_inline(text: str, links: bool = True) -> _Pieces:
    out: _Pieces = []
    literal: list[str] = []

    def emit(node: _Node | None = None, pieces: _Pieces | None = None) -> None:
        if literal:
            out.append("".join(literal))
            literal.clear()
        if node is not None:
            out.append(node)
        out.extend(pieces or [])

    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPABLE:
            literal.append(text[i + 1])
            i += 2
        elif ch == "`":
            span = _code_span(text, i)
            if span:
                emit(_Node("code", [span[0]]))
                i = span[1]
            else:
                literal.append(text[i : i + _run(text, i)])
                i += _run(text, i)
        elif ch == "[" and links and (link := _link(text, i)):
            label, url, i = link
            children = _parse_inline(label, links=False) or [url]
            if url.lower().startswith(_SAFE_SCHEMES):
                emit(_Node("a", children, url))
            else:
                emit(pieces=children)
        elif ch in "*_~":
            emphasis = _emphasis(text, i)
            if emphasis:
                tag, inner, i = emphasis
                emit(_Node(tag, _parse_inline(inner, links)))
            else:
                literal.append(text[i : i + _run(text, i)])
                i += _run(text, i)
        elif text.startswith(("http://", "https://"), i) and (i == 0 or not text[i - 1].isalnum()):
            # A bare URL is shown as written (Telegram links it): "_" in it is not italic.
            end = i
            while end < len(text) and not text[end].isspace():
                end += 1
            literal.append(text[i:end])
            i = end
        else:
            # This character starts nothing, nor does any before the next that may: one run,
            # not a character at a time (the bulk of a reply's rendering).
            found = _INLINE_START.search(text, i + 1)
            end = found.start() if found else len(text)
            literal.append(text[i:end])
            i = end
    emit()
    return out
