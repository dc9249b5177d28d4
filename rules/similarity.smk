# Pair measures between encoders. `pairwise`: exact QRE (both directions) and linear CKA
# (biased, debiased) between every two encoders on the map, one U_i^T U_j per pair. `stitch`:
# RBF CKA and stitches over the configured subset. `compare`: how these notions agree, heatmaps.
# The pair results are update() outputs: the step reads its previous results and recomputes only
# pairs that involve an encoder whose artifact changed (per-encoder fingerprints, src/encmap/
# pipeline/paircache.py); DVC keeps them (persist) for the same reason.
rule pairwise:
    input:
        features="results/features/qre.h5",
        pips=PIPS,
        embeddings=expand("results/embeddings/{model}", model=MODELS),  # U derived from them
    output:
        qre=update("results/similarity/qre_pairwise.h5"),
        cka=update("results/similarity/cka.h5"),
        timing="results/similarity/qre_pairwise.timing.json",
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


rule stitch:
    input:
        features="results/features/qre.h5",
        embeddings=expand("results/embeddings/{model}", model=MODELS),
    output:
        rbf=update("results/similarity/cka_rbf.h5"),
        stitches=update("results/similarity/stitches.json"),
        csv="results/similarity/stitches.csv",
        timing="results/similarity/stitch.timing.json",
    params:
        similarity=config["similarity"],
    conda:
        "../envs/encmap.yaml"
    threads: 8
    log:
        "logs/stitch.log",
    resources:
        gpu=int(bool(config["similarity"]["stitch"]["mlp_depths"])),  # MLP stitches train on a GPU if there is one
    script:
        "../scripts/stitch.py"


rule compare:
    input:
        features="results/features/qre.h5",
        pairwise="results/similarity/qre_pairwise.h5",
        cka="results/similarity/cka.h5",
        rbf="results/similarity/cka_rbf.h5",
        stitches="results/similarity/stitches.json",
    output:
        agreement="results/similarity/agreement.csv",
        metrics="results/similarity/metrics.json",
        **SIMILARITY_FIGURES,
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/compare.log",
    script:
        "../scripts/compare.py"
