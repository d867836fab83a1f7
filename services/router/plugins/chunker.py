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
        begin = 0  # indices, not slices: a 10 MB paragraph is cut in one pass, not copied per chunk
        while len(joined) - begin > size:  # a paragraph longer than a chunk
            end = _cut(joined, begin, size, overlap)
            out.append(joined[begin:end].rstrip())
            resume = _tail_start(joined, begin, end, overlap)  # from after a space: words stay apart
            begin = _skip_space(joined, resume if resume > begin else end)  # no progress with it: carry none
        current, fresh = joined[begin:] if begin else joined, True
    if fresh and current.strip():
        out.append(current)


def _cut(text: str, begin: int, size: int, overlap: int) -> int:
    """Where to end the chunk from `begin` of a text longer than that: after the last whitespace in the
    chunk's second half (past the overlap), else at `size` (a word longer than that is cut where it must be)."""
    high = begin + size
    low = begin + max(size // 2, overlap + 1)
    space = max(text.rfind(" ", low, high), text.rfind("\n", low, high), text.rfind("\t", low, high))
    if space >= 0:
        return space + 1
    end = boundary(text, high)
    return end if end > begin else high


def _tail(text: str, overlap: int) -> str:
    """Up to `overlap` characters of the end of `text`, from a word's start where there is one."""
    return text[_tail_start(text, 0, len(text), overlap):].lstrip()


def _tail_start(text: str, begin: int, end: int, overlap: int) -> int:
    """Where the last (up to) `overlap` characters of text[begin:end] start: at a word's start where there
    is one, else at a character's (`end`: none)."""
    if overlap <= 0:
        return end
    start = end - overlap
    if start <= begin:
        return begin
    spaces = [i for i in (text.find(" ", start, end), text.find("\n", start, end)) if i >= 0]
    if spaces:
        return min(spaces) + 1
    while start < end and boundary(text, start) != start:
        start += 1
    return start


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
