# RBF CKA between the encoders of similarity.subset, on a seeded sample of sentences (RBF needs
# the n x n Gram matrices). Pairs of unchanged encoders are reused (update() output, DVC persist).
rule cka_rbf:
    input:
        **stage_input("cka_rbf"),
    output:
        **stage_output("cka_rbf"),
    params:
        code=stage_code("cka_rbf"),  # keys the pairs it reuses: any edit to its code recomputes them
        subset=config["similarity"]["subset"],
        rbf=config["similarity"]["rbf"],
    conda:
        "../envs/encmap.yaml"
    threads: 8
    log:
        "logs/cka_rbf.log",
    script:
        "../scripts/cka_rbf.py"
