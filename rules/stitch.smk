# Stitches (affine, ridge, Procrustes, MLP; mean and random-source controls) between the encoders
# of similarity.subset, both ways, judged on held-out sentences. Rows of unchanged pairs are reused.
rule stitch:
    input:
        **stage_input("stitch"),
    output:
        **stage_output("stitch"),
    params:
        code=stage_code("stitch"),  # keys the pairs it reuses: any edit to its code recomputes them
        subset=config["similarity"]["subset"],
        stitch=config["similarity"]["stitch"],
    conda:
        "../envs/encmap.yaml"
    threads: 8
    log:
        "logs/stitch.log",
    resources:
        # MLP stitches train on a GPU of their own if there is one (none asked for on the CPU or mps)
        gpu=int(bool(config["similarity"]["stitch"]["mlp_depths"]) and config["similarity"]["stitch"]["device"] not in ("cpu", "mps")),
    script:
        "../scripts/stitch.py"
