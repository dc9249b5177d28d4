# How the pair measures agree over encoder pairs (l1 feature distance, exact QRE, CKA, RBF CKA,
# stitch R^2: Spearman of every two), and heatmaps of CKA and stitch R^2.
rule agreement:
    input:
        **stage_input("agreement"),
    output:
        **stage_output("agreement"),
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/agreement.log",
    script:
        "../scripts/agreement.py"
