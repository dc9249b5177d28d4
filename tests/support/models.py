"""Tiny checkpoints built offline: a random BERT with a WordPiece vocab written from text, and a
sentence-transformers model with its own Pooling and Normalize modules on top of it."""

from __future__ import annotations

from pathlib import Path

WORDS = ("the a of and to in is was for on with as by at from that this it he she they we his her "
         "city river music war king church school film team game book year people world state life "
         "house water light night day man woman child time history art law science language").split()


def build_tiny_bert(path: Path, *, seed: int = 0, layers: int = 2, corrupt: str | None = None) -> Path:
    """Save a randomly initialised 32-d BERT with a WordPiece vocab written from text.

    ``corrupt``: "nan" fills the weights with NaN, "zero" with zeros, "vocab" saves a tokenizer
    that knows only its special tokens (every word becomes [UNK]): broken checkpoints.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + [
        c for c in "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-"] + [
        "##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary itself (`vocab_file=` is ignored: every token became [UNK]).
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    assert tok.tokenize("The city")[0] == "the", "tiny BERT tokenizer lost its vocabulary"
    if corrupt == "vocab":
        tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab[:5])}, do_lower_case=True)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    model = BertModel(cfg)
    if corrupt in ("nan", "zero"):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan") if corrupt == "nan" else 0.0)
    model.save_pretrained(path)
    return path


def build_tiny_st(path: Path, bert_dir: Path, pooling: str = "cls") -> Path:
    """A sentence-transformers model with its own tail: Transformer -> Pooling(cls) -> Normalize.

    Its output (``__out``) is then neither a plain layer variant nor unit-free: CLS of the last
    layer, normalised to unit length.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    t = Transformer(str(bert_dir), max_seq_length=64)
    st = SentenceTransformer(modules=[t, Pooling(t.get_embedding_dimension(), pooling_mode=pooling), Normalize()],
                             device="cpu")
    st.save(str(path))
    return path
