"""A knowledge base's text cut into chunks for embedding (router process, in the indexer's thread):
sections start at headings (Markdown's `#` and underlined ones, as reStructuredText's), paragraphs are
packed into chunks of at most `size` characters, a longer one is cut hard; each chunk after a cut
starts with up to `overlap` characters of the one before. Cuts never part a character from its marks."""
from __future__ import annotations

import re
from collections.abc import Iterator

from services.router.plugins.recall import boundary

_ATX = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
_UNDERLINE = re.compile(r"([=\-~^*+#\"'`])\1{2,}[ \t]*")
_FENCE = re.compile(r" {0,3}(```|~~~)")
_BLANK = re.compile(r"\n[ \t]*\n\s*")


def chunks(text: str, size: int, overlap: int) -> list[str]:
    """Every chunk of `text`, in order, none empty, none longer than `size` (0 <= overlap < size)."""
    assert 0 <= overlap < size, (overlap, size)
    text = text.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")
    out: list[str] = []
    for section in _sections(text):
        _pack([b.strip() for b in _BLANK.split(section) if b.strip()], size, overlap, out)
    return out


def _sections(text: str) -> Iterator[str]:
    """The text split before each heading outside fenced code (a `# comment` in code is no heading)."""
    lines = text.split("\n")
    section: list[str] = []
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        heading = not fenced and (_ATX.match(line) is not None or (
            bool(line.strip()) and i + 1 < len(lines) and _UNDERLINE.fullmatch(lines[i + 1]) is not None
            and _UNDERLINE.fullmatch(line) is None))
        if heading and any(s.strip() for s in section):
            yield "\n".join(section)
            section = []
        section.append(line)
    yield "\n".join(section)


def _pack(blocks: list[str], size: int, overlap: int, out: list[str]) -> None:
    """Paragraphs joined by blank lines while they fit; a section's first chunk carries no overlap."""
    current = ""
    fresh = False  # current holds more than the overlap carried into it
    for block in blocks:
        joined = f"{current}\n\n{block}" if current else block
        if len(joined) > size and fresh and len(block) <= size:
            # The paragraph fits a chunk of its own: it starts one, with the overlap if that fits too
            # (a longer paragraph fills up this chunk first, below).
            out.append(current)
            carried = _tail(current, overlap)
            joined = f"{carried}\n\n{block}" if carried and len(carried) + 2 + len(block) <= size else block
        while len(joined) > size:  # a paragraph longer than a chunk
            end = _cut(joined, size, overlap)
            out.append(joined[:end].rstrip())
            carried = _tail(joined[:end], overlap)  # with the space it was cut after: words stay apart
            if len(carried) >= end:  # the cut could not advance past the overlap: carry none
                carried = ""
            joined = carried + joined[end:] if carried else joined[end:].lstrip()
        current, fresh = joined, True
    if fresh and current.strip():
        out.append(current)


def _cut(text: str, size: int, overlap: int) -> int:
    """Where to cut a text longer than `size`: after the last whitespace in the chunk's second half
    (past the overlap), else at `size` (a word longer than that is cut where it must be)."""
    low = max(size // 2, overlap + 1)
    space = max(text.rfind(" ", low, size), text.rfind("\n", low, size), text.rfind("\t", low, size))
    return space + 1 if space >= 0 else boundary(text, size)


def _tail(text: str, overlap: int) -> str:
    """Up to `overlap` characters of the end of `text`, from a word's start where there is one."""
    if overlap <= 0:
        return ""
    if len(text) <= overlap:
        return text
    start = len(text) - overlap
    space = min((i for i in (text.find(" ", start), text.find("\n", start)) if i >= 0), default=-1)
    if space >= 0:
        return text[space + 1:].lstrip()
    while start < len(text) and boundary(text, start) != start:
        start += 1
    return text[start:]
