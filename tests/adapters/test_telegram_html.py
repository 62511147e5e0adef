"""Telegram HTML rendering: what a user sees of the LLM's Markdown, and never a rejected send.

Every rendered output is checked for what Telegram's HTML parser demands (only its tags, all
closed and properly nested, only its entities); a randomized test does the same over
Markdown-ish noise and checks that no visible character is lost.
"""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser

import pytest

from adapters.telegram_html import plain_text, render_part, to_telegram_html, utf16_len
from bot.outbound.split import split_message

ALLOWED = {"b", "i", "s", "u", "code", "pre", "a", "blockquote"}
# Tags Telegram does not let contain other entities (except <pre><code>).
LEAVES = {"code", "pre"}


class _Checker(HTMLParser):
    """Collects the visible text and asserts Telegram's rules on the way."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.visible: list[str] = []
        self.languages: list[str] = []  # visible text plus code languages, in order

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in ALLOWED, tag
        parent = self.stack[-1] if self.stack else None
        if tag == "code" and parent == "pre":
            assert len(attrs) <= 1
            if attrs:
                name, value = attrs[0]
                assert name == "class" and value and value.startswith("language-")
                self.languages.append(value.removeprefix("language-"))
        else:
            assert parent not in LEAVES, f"<{tag}> inside <{parent}>"
            if tag == "a":
                assert len(attrs) == 1 and attrs[0][0] == "href", attrs
            else:
                assert not attrs, attrs
        assert tag not in self.stack or tag not in {"a", "blockquote"}, f"nested <{tag}>"
        self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raise AssertionError(f"self-closing <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.visible.append(data)
        self.languages.append(data)


def visible(html: str) -> tuple[str, str]:
    """(visible text, visible text with code languages) of well-formed Telegram HTML; fails
    the test if `html` is not."""
    # Outside tags only text and the four entities Telegram knows: no stray < > or &.
    outside = re.sub(r'<(/?)([a-z]+)((?: [a-z]+="[^"<>]*")*)>', "", html)
    assert "<" not in outside and ">" not in outside, html
    assert re.fullmatch(r"(?:[^&]|&(?:lt|gt|amp|quot);)*", outside, re.S), html
    checker = _Checker()
    checker.feed(html)
    checker.close()
    assert not checker.stack, f"unclosed {checker.stack} in {html!r}"
    return "".join(checker.visible), "".join(checker.languages)


def alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


CASES = [
    # (markdown, html)
    ("plain text", "plain text"),
    ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
    ("*italic* and _italic_", "<i>italic</i> and <i>italic</i>"),
    ("~~struck~~", "<s>struck</s>"),
    ("use `x < y` here", "use <code>x &lt; y</code> here"),
    ("``a ` b``", "<code>a ` b</code>"),
    ("`**not bold**`", "<code>**not bold**</code>"),
    ("***both***", "<b><i>both</i></b>"),
    ("**bold *italic* bold**", "<b>bold <i>italic</i> bold</b>"),
    ("*it **bold** it*", "<i>it <b>bold</b> it</i>"),
    ("**bold _it_**", "<b>bold <i>it</i></b>"),
    ("# Title", "<b>Title</b>"),
    ("### Sub **x** ###", "<b>Sub <b>x</b></b>"),
    ("#hashtag", "#hashtag"),
    ("- one\n* two\n+ three", "• one\n• two\n• three"),
    ("  - nested *it*", "  • nested <i>it</i>"),
    ("1. first\n2) second", "1. first\n2) second"),
    ("---", "---"),
    ("> quoted\n> **more**\nafter", "<blockquote>quoted\n<b>more</b></blockquote>\nafter"),
    ("> ", "&gt; "),
    (">\n> ", "&gt;\n&gt; "),
    (
        "```python\nif a < b && c > d:\n    **x** = `y`\n```",
        '<pre><code class="language-python">if a &lt; b &amp;&amp; c &gt; d:\n'
        "    **x** = `y`</code></pre>",
    ),
    ("```\n<tag>\n```", "<pre>&lt;tag&gt;</pre>"),
    ("```\nopen to the end", "<pre>open to the end</pre>"),
    ("```\n```", "```\n```"),
    ("```py", "```py"),
    (
        "before\n```js\nx\n```\nafter",
        'before\n<pre><code class="language-js">x</code></pre>\nafter',
    ),
    (
        "[site](https://example.com/a?b=1&c=2)",
        '<a href="https://example.com/a?b=1&amp;c=2">site</a>',
    ),
    ('[q](https://x.io/"><script>)', '<a href="https://x.io/&quot;&gt;&lt;script&gt;">q</a>'),
    ("[a <b> & c](http://x.io)", '<a href="http://x.io">a &lt;b&gt; &amp; c</a>'),
    ("[**bold** link](tg://user?id=1)", '<a href="tg://user?id=1"><b>bold</b> link</a>'),
    ("[mail](mailto:a@b.c)", '<a href="mailto:a@b.c">mail</a>'),
    ("[wiki](https://w.org/A_(b))", '<a href="https://w.org/A_(b)">wiki</a>'),
    ("[x](javascript:alert(1))", "x"),
    ("[x](data:text/html,hi)", "x"),
    ("[x](/relative)", "x"),
    ("[not a link] (https://x.io)", "[not a link] (https://x.io)"),
    ("1 < 2 > 0 & \"q\" 'a'", "1 &lt; 2 &gt; 0 &amp; \"q\" 'a'"),
    ("&lt; stays text", "&amp;lt; stays text"),
    ("snake_case_name and my_var_", "snake_case_name and my_var_"),
    ("2*3*4 and a * b * c", "2*3*4 and a * b * c"),
    ("__init__.py and *args*.txt", "__init__.py and *args*.txt"),
    ("__init__ is bold, as in CommonMark", "<b>init</b> is bold, as in CommonMark"),
    ("_end_. next", "<i>end</i>. next"),
    ("https://x.io/_a_b_ stays", "https://x.io/_a_b_ stays"),
    ("\\*literal\\* and \\_x\\_", "*literal* and _x_"),
    ("~5 minutes", "~5 minutes"),
    # Unbalanced markers stay literal.
    ("**open", "**open"),
    ("*open and **also", "*open and **also"),
    ("_half", "_half"),
    ("~~half", "~~half"),
    ("`half", "`half"),
    ("[half](https://x.io", "[half](https://x.io"),
    ("** spaced **", "** spaced **"),
    ("****", "****"),
]


@pytest.mark.parametrize(("markdown", "html"), CASES)
def test_renders(markdown: str, html: str) -> None:
    rendered = to_telegram_html(markdown)
    assert rendered == html
    shown, _ = visible(rendered)
    assert utf16_len(plain_text(markdown)) <= utf16_len(markdown)
    if "](" not in markdown:
        # Without links the fallback is exactly what the HTML shows.
        assert plain_text(markdown) == shown


PLAIN = [
    ("**bold** _it_ ~~s~~ `c`", "bold it s c"),
    ("# Head\n- item\n> quote", "Head\n• item\nquote"),
    ("```py\nx = 1\n```\ndone", "x = 1\ndone"),
    ("[site](https://x.io)", "site (https://x.io)"),
    ("[https://x.io](https://x.io)", "https://x.io"),
    ("[](https://x.io)", "https://x.io"),
    ("[x](javascript:alert(1))", "x"),
    ("a < b & c", "a < b & c"),
    ("snake_case 2*3*4 **open", "snake_case 2*3*4 **open"),
]


@pytest.mark.parametrize(("markdown", "text"), PLAIN)
def test_plain_text(markdown: str, text: str) -> None:
    assert plain_text(markdown) == text


def test_utf16_len() -> None:
    assert utf16_len("") == 0
    assert utf16_len("abc") == 3
    assert utf16_len("é€") == 2  # BMP: one unit each
    assert utf16_len("😀") == 2
    assert utf16_len("hi 👍🏽") == 3 + 4  # emoji plus skin tone modifier
    assert utf16_len("😀" * 10) == len("😀" * 10) * 2


def test_render_part_prefers_html() -> None:
    assert render_part("**hi** <3") == ("<b>hi</b> &lt;3", "HTML")


def test_render_part_falls_back_to_plain_when_html_is_too_long() -> None:
    markdown = "**x** " * 100
    html, mode = render_part(markdown, limit=len(markdown))
    assert mode is None
    assert html == plain_text(markdown)
    assert "<" not in html


def test_render_part_never_sends_an_empty_message() -> None:
    # Telegram rejects empty entities and empty messages: an empty block is shown as written.
    assert render_part("```\n```") == ("```\n```", "HTML")


def test_render_part_refuses_a_blank_part() -> None:
    with pytest.raises(ValueError, match="blank"):
        render_part(" \n ")


def test_render_part_refuses_to_truncate() -> None:
    with pytest.raises(ValueError, match="UTF-16"):
        render_part("😀" * 3000)  # 3000 characters but 6000 UTF-16 units


def test_split_parts_always_fit() -> None:
    """Parts from split_message fit Telegram: as HTML when they can, else as plain text."""
    rng = random.Random(4096)
    pieces = [
        "**bold** ",
        "_it_ ",
        "a < b & c > d ",
        "[link](https://example.com/x) ",
        "`code` ",
        "word ",
        "\n",
        "\n\n",
        "- item\n",
        "> quote\n",
        "```python\nx = 1 < 2\ny = [i for i in range(3)]\n```\n",
    ]
    text = "".join(rng.choice(pieces) for _ in range(6000))
    margin = 96
    parts = split_message(text, 4096 - margin)
    assert len(parts) > 3
    modes = set()
    for part in parts:
        sent, mode = render_part(part)
        assert utf16_len(sent) <= 4096
        modes.add(mode)
        if mode == "HTML":
            visible(sent)
    # Dense markup inflates these parts past the limit as HTML, so both paths are exercised.
    assert None in modes


def test_short_parts_send_as_html() -> None:
    text = "Some **bold** prose with `code`.\n\n" * 300
    for part in split_message(text, 2500):
        assert render_part(part)[1] == "HTML"


ALPHABET = [*"ab_ *~`[]#>-+12\\<>&\"'.é\t", "😀", "**", "__", "~~", "\n", "\n> ", "\n- "]


def _random_markdown(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.15:
            lines.append(rng.choice(["```", "```py", "````"]))
            continue
        line = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))
        for piece in line.split("\n"):
            # Only the fence lines above open code blocks: a random one could swallow its
            # info string (say "```a b"), which is not visible text.
            lines.append("x" + piece if piece.lstrip().startswith("`") else piece)
    return "\n".join(lines)


def test_random_markdown_is_well_formed_and_loses_nothing() -> None:
    rng = random.Random(20240601)
    for _ in range(3000):
        markdown = _random_markdown(rng)
        html = to_telegram_html(markdown)
        try:
            shown, with_languages = visible(html)
        except AssertionError as error:
            raise AssertionError(f"{markdown!r} -> {html!r}: {error}") from error
        assert alnum(with_languages) == alnum(markdown), (markdown, html)
        # No links in the alphabet (no parentheses), so the fallback equals what HTML shows.
        assert plain_text(markdown) == shown, (markdown, html)
        assert utf16_len(shown) <= utf16_len(markdown)
