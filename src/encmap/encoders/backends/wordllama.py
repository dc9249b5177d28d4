"""WordLlama: an LLM's token-embedding table trained contrastively, averaged over a sentence's tokens.

``package:wordllama`` is the ``l2_supercat_256`` model inside the wordllama wheel (Llama 2's
32,000-token vocabulary, 256-d, trained with Matryoshka losses at 64, 128, 256 dims, so
``dims`` truncations are meaningful). The wheel ships the tokenizer in ``tokenizers/`` while its
loader looks in ``tokenizer/`` and then goes to the hub; so the shipped files are opened here and
handed to the package's own encoder (``WordLlamaInference``), which is what ``WordLlama.load``
returns when the files are found.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import resolve_source
from ..result import EmbeddingResult, output_only

#: The packaged model: its weights file, the tensor in it, and its tokenizer file.
WEIGHTS = "weights/l2_supercat_256.safetensors"
TENSOR = "embedding.weight"
TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"


def load(root: str | Path, model: str):
    """The package's encoder over the weights and tokenizer under ``root`` (the wordllama folder)."""
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    root = Path(root)
    for rel in (WEIGHTS, TOKENIZER):
        if not (root / rel).is_file():
            raise EncmapError(f"model {model!r}: {root / rel} is missing from the wordllama package")
    with safe_open(str(root / WEIGHTS), framework="np", device="cpu") as f:
        table = f.get_tensor(TENSOR)
    return WordLlamaInference(table, Tokenizer.from_file(str(root / TOKENIZER)), binary=False)


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import wordllama  # noqa: F401
    except ImportError:
        raise EncmapError(f"model {model!r}: backend wordllama needs the wordllama package (pip install wordllama)") from None
    ref, prov = resolve_source(spec["source"], model)
    enc = load(ref, model)
    # norm=False: the mean of token vectors as it is; the map's PIP sees its norms too.
    full = np.asarray(enc.embed(list(texts), norm=False, batch_size=spec["batch_size"]), dtype=np.float32)
    prov |= {"model_id": "wordllama:l2_supercat_256", "vocabulary": int(enc.embedding.shape[0])}
    return output_only(model, spec, full, prov)
