"""``encmap`` command line: inspect params and artifacts, and name the Snakemake targets DVC runs."""

from __future__ import annotations

import argparse
import sys

from .validation import EncmapError


def main(argv: list[str] | None = None) -> int:
    from .config import LAYOUT, artifact_paths, expand_encoders, load_params

    ap = argparse.ArgumentParser(prog="encmap", description=__doc__)
    ap.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="validate the params file against the schema")
    sub.add_parser("encoders", help="list every encoder: id, model, layer, pooling, dim (TSV)")
    t = sub.add_parser("targets", help="per-encoder Snakemake targets of one stage")
    t.add_argument("stage", choices=sorted(LAYOUT))
    t.add_argument("models", nargs="*", help="model ids (default: all)")
    s = sub.add_parser("show", help="print an artifact's attributes (JSON)")
    s.add_argument("path")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "show":
            from .pipeline import describe

            print(describe(args.path))
            return 0
        params = load_params(args.params)
        if args.cmd == "check":
            print(f"{args.params}: valid, {len(expand_encoders(params['models']))} encoders")
        elif args.cmd == "encoders":
            for e, v in sorted(expand_encoders(params["models"]).items()):
                print("\t".join(str(x) for x in (e, v.model, v.layer, v.pooling, v.dim)))
        else:
            print("\n".join(artifact_paths(params["models"], args.stage, args.models)))
    except (EncmapError, OSError) as e:
        print(f"encmap: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
