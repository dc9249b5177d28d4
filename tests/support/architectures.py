"""Tiny randomly initialised checkpoints of the architectures on MTEB's leaderboard, built offline.

Each is saved as a sentence-transformers model with the tokenizer behaviour and the pooling its
real counterparts use: BERT with CLS pooling (bge), XLM-RoBERTa with mean (multilingual-e5), a T5
encoder with mean, a dense head and normalisation (sentence-t5 / gtr), ModernBERT with mean
(modernbert-embed), a Qwen3 decoder with an appended EOS, left padding and last-token pooling
(Qwen3-Embedding), and a Mistral decoder with BOS and EOS, right padding and last-token pooling
(e5-mistral). The tokenizer is a word-level one over a fixed vocabulary (real ones differ in
how they split words, not in what the embedding route does with the ids).
"""

from __future__ import annotations

from pathlib import Path

from .models import WORDS

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-R's ids: bos 0, pad 1, eos 2, unk 3
BOS, PAD, EOS, UNK = range(4)

#: architecture -> (ST pooling mode, padding side, template of one text, transformer layers)
ARCHITECTURES = {
    "bert": ("cls", "right", "<s> $A </s>", 2),
    "xlm-roberta": ("mean", "right", "<s> $A </s>", 2),
    "t5": ("mean", "right", "$A </s>", 2),
    "modernbert": ("mean", "right", "<s> $A </s>", 3),
    "qwen3": ("lasttoken", "left", "$A </s>", 2),
    "mistral": ("lasttoken", "right", "<s> $A </s>", 2),
}
#: Decoders: attention is causal, their embedders pool the last token.
CAUSAL = ("qwen3", "mistral")


def _tokenizer(padding_side: str, template: str):
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + sorted(set(WORDS)) + list(".,;:!?'\"()-"))}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[
        (t, vocab[t]) for t in ("<s>", "</s>") if t in template])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", cls_token="<s>", sep_token="</s>", padding_side=padding_side,
                                   model_max_length=64), len(vocab)


def _config(arch: str, vocab_size: int, layers: int):
    import transformers as tf

    common = {"vocab_size": vocab_size, "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS}
    small = {"hidden_size": 32, "num_hidden_layers": layers, "num_attention_heads": 2, "intermediate_size": 64}
    if arch == "bert":
        return tf.BertConfig(**common, **small, max_position_embeddings=128)
    if arch == "xlm-roberta":
        return tf.XLMRobertaConfig(**common, **small, max_position_embeddings=130)
    if arch == "t5":
        return tf.T5Config(**common, d_model=32, d_kv=16, d_ff=64, num_layers=layers, num_heads=2,
                           decoder_start_token_id=PAD)
    if arch == "modernbert":
        return tf.ModernBertConfig(**common, **small, cls_token_id=BOS, sep_token_id=EOS, max_position_embeddings=128,
                                   global_attn_every_n_layers=2, local_attention=16)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, **small, num_key_value_heads=1, head_dim=16, max_position_embeddings=128)
    if arch == "mistral":
        return tf.MistralConfig(**common, **small, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                                sliding_window=None)
    raise ValueError(arch)


def build_tiny_architecture(arch: str, path: Path, *, seed: int = 0) -> Path:
    """Save a tiny random ``arch`` checkpoint as a sentence-transformers model at ``path``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling
    from transformers import AutoModel, T5EncoderModel

    pooling, side, template, layers = ARCHITECTURES[arch]
    raw = path / "raw"
    tok, vocab_size = _tokenizer(side, template)
    tok.save_pretrained(raw)
    torch.manual_seed(seed)
    cfg = _config(arch, vocab_size, layers)
    # sentence-t5 / gtr checkpoints hold the encoder stack alone (architectures: T5EncoderModel).
    net = T5EncoderModel(cfg) if arch == "t5" else AutoModel.from_config(cfg)
    net.save_pretrained(raw)
    t = Transformer(str(raw), max_seq_length=64)
    modules = [t, Pooling(t.get_embedding_dimension(), pooling_mode=pooling)]
    if arch == "t5":
        modules.append(Dense(32, 24, bias=False, activation_function=torch.nn.Identity()))
    if arch in ("bert", "t5", "qwen3"):
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    return path
