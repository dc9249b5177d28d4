# Exact pairwise QRE between the encoders on the map (for the exact-qre map and the faithfulness
# metrics), then the map: t-SNE coordinates, neighbours, figures, the interactive page, metrics.
rule pairwise:
    input:
        features="results/features/qre.h5",
        pips=PIPS,
    output:
        qre="results/similarity/qre_pairwise.h5",
        timing="results/similarity/qre_pairwise.timing.json",
    params:
        eps=config["qre"]["eps"],
    conda:
        "../envs/encmap.yaml"
    threads: 8  # BLAS threads of the U_i^T U_j products (capped at --cores locally)
    log:
        "logs/pairwise.log",
    script:
        "../scripts/pairwise.py"


rule map:
    input:
        features="results/features/qre.h5",
        pairwise="results/similarity/qre_pairwise.h5",
    output:
        coords="results/map/coords.csv",
        neighbours="results/map/neighbours.csv",
        html="results/map/map.html",
        model="results/map/model.h5",
        metrics="results/map/metrics.json",
        timing="results/map/timing.json",
        **MAP_FIGURES,
    params:
        map=config["map"],
    conda:
        "../envs/encmap.yaml"
    log:
        "logs/map.log",
    script:
        "../scripts/map.py"
