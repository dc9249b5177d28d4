# Stitches (affine, ridge, Procrustes, MLP; mean and random-source controls) between the encoders
# of similarity.subset, both ways, judged on held-out sentences. Rows of unchanged pairs are reused.
rule stitch:
    input:
        features="results/features/qre.h5",
        embeddings=expand("results/embeddings/{model}", model=MODELS),
    output:
        stitches=update("results/similarity/stitches.json"),
        csv=update("results/similarity/stitches.csv"),
        timing=update("results/similarity/stitch.timing.json"),
    params:
        subset=config["similarity"]["subset"],
        stitch=config["similarity"]["stitch"],
    conda:
        "../envs/encmap.yaml"
    threads: 8
    log:
        "logs/stitch.log",
    resources:
        gpu=int(bool(config["similarity"]["stitch"]["mlp_depths"])),  # MLP stitches train on a GPU if there is one
    script:
        "../scripts/stitch.py"
