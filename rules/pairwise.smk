# Exact QRE (both directions) and linear CKA (biased, debiased) between every two encoders on the
# map, one U_i^T U_j per pair. update() outputs: the step reads its previous results and recomputes
# only pairs that involve an encoder whose artifact changed (encmap.artifacts.paircache); DVC keeps
# them (persist) for the same reason.
rule pairwise:
    input:
        features="results/features/qre.h5",
        pips=PIPS,
        embeddings=expand("results/embeddings/{model}", model=MODELS),  # U derived from them
    output:
        qre=update("results/similarity/qre_pairwise.h5"),
        cka=update("results/similarity/cka.h5"),
        timing=update("results/similarity/qre_pairwise.timing.json"),
    params:
        eps=config["qre"]["eps"],
        device=config["pairwise"]["device"],
        block_columns=config["pairwise"]["block_columns"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # BLAS threads of the U_i^T U_j products (capped at --cores locally)
    log:
        "logs/pairwise.log",
    resources:
        gpu=int(config["pairwise"]["device"] not in ("cpu", "mps")),  # the block GEMMs run on a GPU if there is one
    script:
        "../scripts/pairwise.py"
