# Exact QRE (both directions) and linear CKA (biased, debiased) between every two encoders on the
# map, one U_i^T U_j per pair. update() outputs: the step reads its previous results and recomputes
# only pairs that involve an encoder whose artifact changed (encmap.artifacts.paircache); DVC keeps
# them (persist) for the same reason.
rule pairwise:
    input:
        **stage_input("pairwise"),
    output:
        **stage_output("pairwise"),
    params:
        code=stage_code("pairwise"),  # keys the pairs it reuses: any edit to its code recomputes them
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
