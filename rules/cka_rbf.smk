# RBF CKA between the encoders of similarity.subset, on a seeded sample of sentences (RBF needs
# the n x n Gram matrices). Pairs of unchanged encoders are reused (update() output, DVC persist).
rule cka_rbf:
    input:
        features="results/features/qre.h5",
        embeddings=expand("results/embeddings/{model}", model=MODELS),
    output:
        rbf=update("results/similarity/cka_rbf.h5"),
        timing=update("results/similarity/cka_rbf.timing.json"),
    params:
        subset=config["similarity"]["subset"],
        rbf=config["similarity"]["rbf"],
    conda:
        "../envs/encmap.yaml"
    threads: 8
    log:
        "logs/cka_rbf.log",
    script:
        "../scripts/cka_rbf.py"
