"""Training text for the encoders the pipeline trains itself (word2vec, fastText, doc2vec).

Only sources that no evaluation task reads are allowed, so no evaluation item can be in the
training text by construction: the downstream tasks draw on WordNet (examples, definitions), the
Brown corpus, gensim's ``lee.cor`` and ``pang_lee_polarity.cor`` and two word-similarity lists;
the training text is Wikipedia (gensim's bundled dump sample, the probe set's ``wiki`` source)
and the Lee *background* corpus (314 news documents written to train on for the Lee similarity
task, none of its 50 rated documents). The probe sentences drawn from Wikipedia stay in: real
encoders have read Wikipedia too, and the map compares encoders on sentences, not on whether they
saw them. The word-similarity tasks rate single words, which any word-vector training text contains.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..validation import EncmapError

#: Training text sources (``train.corpus`` in params): none of them is read by an evaluation task.
TRAINING_SOURCES = ("gensim-wiki", "lee-background")

_WIKI_MARKUP = re.compile(r"'{2,}")


def _lee_background(gensim_dir: Path) -> list[str]:
    from ..io import read_legacy_text

    f = gensim_dir / "lee_background.cor"
    if not f.is_file():
        raise EncmapError(f"training source 'lee-background': {f} not found (gensim's test data; pip install gensim)")
    return [line.strip() for line in read_legacy_text(f).splitlines() if line.strip()]


def training_texts(sources: list[str]) -> list[str]:
    """The training documents of ``sources`` (names from :data:`TRAINING_SOURCES`), in a fixed order.

    Returns
    -------
    list of str
        Wikipedia: one sentence each (bold/italic quotes removed); Lee background: one document each.
    """
    from ..corpus.wikipedia import gensim_wiki_path, read_gensim_wiki

    out: list[str] = []
    for name in sources:
        if name == "gensim-wiki":
            out += [_WIKI_MARKUP.sub("", c.text) for c in read_gensim_wiki(name)]
        elif name == "lee-background":
            out += _lee_background(gensim_wiki_path().parent)
        else:
            raise EncmapError(f"training source {name!r} is not allowed (allowed: {', '.join(TRAINING_SOURCES)}; "
                              "the others hold evaluation items)")
    return out


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens, as word2vec-style models are trained and applied (gensim's simple_preprocess)."""
    from gensim.utils import simple_preprocess

    return simple_preprocess(text, min_len=1, max_len=30)


def texts_sha256(texts: list[str]) -> str:
    """sha256 of a list of texts (each UTF-8, NUL-terminated): what a trained model is keyed by."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()
