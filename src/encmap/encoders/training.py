"""Training text for the encoders the pipeline trains itself (word2vec, fastText, doc2vec).

Only sources that no evaluation task reads are allowed, so no evaluation item can be in the
training text by construction: the downstream tasks draw on WordNet (examples, definitions), the
Brown corpus, gensim's ``lee.cor`` and ``pang_lee_polarity.cor`` and two word-similarity lists;
the training text is Wikipedia (gensim's bundled dump sample, the probe set's ``wiki`` source,
read the way gensim's ``WikiCorpus`` reads a dump: ``extract_pages`` and ``filter_wiki``, one
document per paragraph) and the Lee *background* corpus (314 news documents written to train on for the Lee similarity
task, none of its 50 rated documents). The probe sentences drawn from Wikipedia stay in: real
encoders have read Wikipedia too, and the map compares encoders on sentences, not on whether they
saw them. The word-similarity tasks rate single words, which any word-vector training text contains.

Deliberately not :mod:`encmap.corpus`: the embed and evaluate stages run this module, and an edit
to the probe-sentence readers must not make every model of the map stale.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

from ..io import GENSIM_WIKI_SAMPLE, gensim_test_data
from ..validation import EncmapError

#: Training text sources (``train.corpus`` in params): none of them is read by an evaluation task.
TRAINING_SOURCES = ("gensim-wiki", "lee-background")

_WIKI_MARKUP = re.compile(r"'{2,}")


def _wikipedia(f: Path) -> list[str]:
    if not f.is_file():
        raise EncmapError(f"training source 'gensim-wiki': {f} not found (gensim's test data; pip install gensim)")
    st = f.stat()
    return list(_wikipedia_read(str(f), st.st_mtime_ns, st.st_size))


@lru_cache(maxsize=2)
def _wikipedia_read(f: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """Parsed once per process and file version (2.4 s): the embed jobs of the trained models share
    Snakemake's process."""
    import bz2

    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    out = []
    with bz2.open(f, "rb") as fh:
        for _title, text, _pageid in extract_pages(fh, filter_namespaces=("0",)):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            out += [p.strip() for p in _WIKI_MARKUP.sub("", filter_wiki(text)).split("\n") if len(p.split()) >= 3]
    return tuple(out)


def _lee_background(gensim_dir: Path) -> list[str]:
    from ..io import read_utf8_or_cp1252

    f = gensim_dir / "lee_background.cor"
    if not f.is_file():
        raise EncmapError(f"training source 'lee-background': {f} not found (gensim's test data; pip install gensim)")
    return [line.strip() for line in read_utf8_or_cp1252(f).splitlines() if line.strip()]


def training_texts(sources: list[str]) -> list[str]:
    """The training documents of ``sources`` (names from :data:`TRAINING_SOURCES`), in a fixed order.

    Returns
    -------
    list of str
        Wikipedia: one paragraph (of 3 words or more) each; Lee background: one document each.
    """
    out: list[str] = []
    for name in sources:
        if name == "gensim-wiki":
            out += _wikipedia(gensim_test_data("the training text") / GENSIM_WIKI_SAMPLE)
        elif name == "lee-background":
            out += _lee_background(gensim_test_data("the training text"))
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
