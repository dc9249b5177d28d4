"""Wikipedia: article sentences from an XML dump (default: the sample inside gensim's wheel).

Inline templates are rendered or deleted before gensim's ``filter_wiki`` runs, so that no
sentence keeps a hole where a value was (see :func:`expand_templates`).
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path
from typing import Iterator

from ..io import GENSIM_WIKI_SAMPLE, gensim_test_data
from ..validation import EncmapError
from .candidates import INSTALL_HINT, Candidate

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences at ., ! or ? followed by a capitalised word."""
    return [s.strip() for s in _SENT_SPLIT.split(text) if s.strip()]


def gensim_wiki_path() -> Path:
    return gensim_test_data("source kind 'gensim-wiki'") / GENSIM_WIKI_SAMPLE


# Inline templates. gensim's filter_wiki deletes every {{...}}, which leaves holes in prose
# ("an area of and a population of"). Before it runs: templates whose text is part of the
# sentence are rendered, reference/maintenance templates are deleted (they stand outside the
# prose), and any other inline template becomes a marker that drops its sentence.
_HOLE = "\ue000"
_TEMPLATE = re.compile(r"\{\{([^{}]*)\}\}")
_MATH = re.compile(r"<(math|chem|ce|score)\b[^>]*>.*?</\1\s*>", re.S | re.I)
_RANGE_WORDS = {"-": "–", "–": "–", "to": "to", "and": "and", "or": "or", "by": "by", "x": "×"}
_DELETE = ("cite", "citation", "harv", "sfn", "rp", "refn", "efn", "ref", "dead link", "clarify",
           "page needed", "wayback", "webarchive", "by whom", "who?", "when?", "according to whom",
           "vague", "dubious", "update", "failed verification", "better source", "full citation",
           "main", "see also", "further", "reflist", "use ", "authority control", "r from", "short description",
           "good article", "featured article", "pp-", "sic", "anchor", "toc", "-", "clear", "flagicon")


def _render_template(body: str) -> str:
    """The prose of one template (no nested templates left), or "" or the drop marker."""
    parts = [p.strip() for p in body.split("|")]
    name = parts[0].lower().replace("_", " ")
    pos = [p for p in parts[1:] if "=" not in p]  # positional arguments
    if name in ("convert", "cvt") and len(pos) >= 2:
        if len(pos) >= 4 and pos[1] in _RANGE_WORDS:  # {{convert|1|to|5|km}}
            return f"{pos[0]} {_RANGE_WORDS[pos[1]]} {pos[2]} {pos[3]}"
        return f"{pos[0]} {pos[1]}"
    if name.startswith("formatnum:"):
        return parts[0].split(":", 1)[1]
    if (name == "lang" or name == "transl") and len(pos) >= 2:
        return pos[-1]
    if name.startswith("lang-") and pos:
        return pos[0]
    if name in ("nowrap", "small", "sc", "smallcaps", "nihongo", "nobr") and pos:
        return pos[0]
    if name == "as of" and pos:
        return f"{parts[0].strip()[:5]} {' '.join(pos[:3])}"  # keeps "As of" / "as of"
    if name == "'s":
        return "'s"
    if name.startswith(_DELETE):
        return ""
    return _HOLE


def _inline_template(text: str, m: re.Match) -> str:
    """A template starting its line (infobox, navbox, hatnote) is not prose and goes."""
    line_start = text.rfind("\n", 0, m.start()) + 1
    return _render_template(m.group(1)) if text[line_start:m.start()].strip() else ""


def expand_templates(wikitext: str) -> str:
    """Render or delete templates, innermost first (see :func:`_render_template`)."""
    # Formulas are deleted by filter_wiki too, and their sentence would read "the mean of and is".
    text = _MATH.sub(_HOLE, wikitext)
    for _ in range(20):  # nesting depth
        new = _TEMPLATE.sub(lambda m: _inline_template(text, m), text)
        if new == text:
            break
        text = new
    return text


def read_gensim_wiki(name: str, path: str | None = None) -> Iterator[Candidate]:
    """Article sentences from a Wikipedia XML dump (default: gensim's bundled sample)."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    p = Path(path) if path else gensim_wiki_path()
    if not p.exists():
        raise EncmapError(f"source {name!r}: {p} not found; install: {INSTALL_HINT['gensim-wiki']}")
    with bz2.open(p, "rb") as fh:
        for title, text, _pageid in extract_pages(fh, filter_namespaces=("0",)):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            plain = filter_wiki(expand_templates(text))
            for para in plain.split("\n"):
                para = para.strip()
                # Headings, list items, tables and leftovers of templates are not prose.
                if not para or para[0] in "=*#|!{:;" or para.startswith("Category:"):
                    continue
                for s in split_sentences(re.sub(r"\s+", " ", para)):
                    if _HOLE not in s:
                        yield Candidate(s, name, "wikipedia", title)
