"""One module per embedding backend; each exposes ``embed(model, spec, texts, device, threads)``
(see :mod:`encmap.encoders.embed`, which loads them by name)."""
