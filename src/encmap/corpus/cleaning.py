"""Cleaning and filtering candidate sentences, and the key that finds near-duplicates.

Shared by curation (what enters the probe set) and the evaluation tasks (which items are probe
sentences and must be removed).
"""

from __future__ import annotations

import html
import re
import unicodedata


_MARKUP = re.compile(r"\[\[|\]\]|\{\{|\}\}")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")  # "( )" left where markup was removed
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """Unicode NFC, HTML entities, leftover wiki quotes/brackets, and whitespace."""
    t = unicodedata.normalize("NFC", html.unescape(text))
    t = t.replace("'''", "").replace("''", '"')
    t = _MARKUP.sub("", t)
    t = _EMPTY_PARENS.sub("", t)
    t = _SPACE_BEFORE_PUNCT.sub(r"\1", t)
    return _SPACES.sub(" ", t).strip()


def normalise_key(text: str) -> str:
    """Key for near-duplicate detection: casefolded letters and digits only."""
    return re.sub(r"[^0-9a-z]+", "", unicodedata.normalize("NFKD", text).casefold())


def keep(text: str, min_words: int, max_words: int, min_alpha: float) -> bool:
    """Filters: word count range, mostly alphabetic, a complete sentence (no fragment)."""
    words = text.split()
    if not (min_words <= len(words) <= max_words):
        return False
    letters = sum(c.isalpha() for c in text)
    if letters / max(1, sum(not c.isspace() for c in text)) < min_alpha:
        return False
    # Fragments: must start with a capital letter or a quote and end with terminal punctuation.
    if not (text[0].isupper() or (text[0] in "\"'" and len(text) > 1 and text[1].isupper())):
        return False
    if text.rstrip("\"')")[-1:] not in (".", "!", "?"):
        return False
    if any(s in text for s in ("http", "www.", "|", "<", ">", "{", "}", "=", "\\", "_")):
        return False
    return text.count('"') % 2 == 0 and text.count("(") == text.count(")")
