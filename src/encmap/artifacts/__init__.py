"""On-disk formats that several stages share: per-encoder embeddings files, the stored PIP, the
feature matrix, and stored pair results reused across runs (reading is checked, writing atomic)."""
