# How the pair measures agree over encoder pairs (l1 feature distance, exact QRE, CKA, RBF CKA,
# stitch R^2: Spearman of every two), and heatmaps of CKA and stitch R^2.
rule agreement:
    input:
        features="results/features/qre.h5",
        pairwise="results/similarity/qre_pairwise.h5",
        cka="results/similarity/cka.h5",
        rbf="results/similarity/cka_rbf.h5",
        stitches="results/similarity/stitches.json",
    output:
        agreement=update("results/similarity/agreement.csv"),
        metrics=update("results/similarity/metrics.json"),
        **SIMILARITY_FIGURES,
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/agreement.log",
    script:
        "../scripts/agreement.py"
