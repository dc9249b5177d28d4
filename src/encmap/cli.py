"""encmap: a map of sentence encoders. The pipeline runs through snakemake or dvc repro / encmap repro;
these commands check its params, inspect its artifacts, place a new encoder, and read MTEB's catalogue
and published results."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from .validation import EncmapError


class Command(NamedTuple):
    """One ``encmap`` command: the table :data:`COMMANDS` holds one per command, in the order
    ``encmap --help`` lists them."""

    name: str
    #: parsed arguments -> exit status; its imports are its own (a command loads only what it runs)
    run: Callable[[argparse.Namespace], int]
    #: adds the command's arguments to its subparser (None: it takes none)
    build: Callable[[argparse.ArgumentParser], None] | None = None
    #: its line in ``encmap --help`` (None: plumbing, named in the epilog instead)
    help: str | None = None
    #: the head of ``encmap COMMAND --help`` (default: none)
    description: str | None = None


def main(argv: list[str] | None = None) -> int:
    """Run ``encmap ARGV``: the parser is built from :data:`COMMANDS`, the command's runner gives the
    exit status; an :class:`EncmapError` or ``OSError`` is one line on stderr and exit 2."""
    ap = argparse.ArgumentParser(prog="encmap", description=__doc__, epilog=_PLUMBING,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", title="commands")
    for c in COMMANDS:  # help= only when given: argparse lists every parser given one, None included
        parser = sub.add_parser(c.name, description=c.description, **({"help": c.help} if c.help else {}))
        if c.build:
            c.build(parser)
    argv = _renamed(list(sys.argv[1:] if argv is None else argv))
    head, passed = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = ap.parse_args(head, argparse.Namespace(snakemake_args=passed))  # `encmap repro ... -- <snakemake args>`
    try:
        return next(c.run for c in COMMANDS if c.name == args.cmd)(args)
    except (EncmapError, OSError) as e:
        print(f"encmap: error: {e}", file=sys.stderr)
        return 2


_PLUMBING = """\
plumbing, the commands dvc.yaml's stages run (rarely typed by hand):
  encmap stage [NAME]     run one DVC stage's Snakemake job (NAME: map, embed@<model>; default $DVC_STAGE)
  encmap params-slices    write each stage's params slice under results/params
  encmap deps --digest    write each stage's code digest under results/code
"""

#: Old command names still accepted (with a note on stderr): old name -> new name.
_RENAMED = {"zoo": "catalogue"}


def _renamed(argv: list[str]) -> list[str]:
    """``argv`` with a renamed command replaced by its new name (a note says so)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--params" else 1  # the only option before the command takes a value
    if i < len(argv) and argv[i] in _RENAMED:
        print(f"encmap: note: `encmap {argv[i]}` is now `encmap {_RENAMED[argv[i]]}`", file=sys.stderr)
        argv = argv[:i] + [_RENAMED[argv[i]]] + argv[i + 1:]
    return argv


# Each command: its arguments (``_<name>_args``, given its subparser) and its runner (``_<name>``,
# parsed args -> exit status), in the order of COMMANDS.

def _check(args: argparse.Namespace) -> int:
    from .encoders.variants import expand_encoders
    from .params import check_api_keys, check_mteb_targets, load_params

    params = load_params(args.params)
    check_mteb_targets(params, args.params)  # as params-slices, DVC's first stage, does: before any job
    check_api_keys(params, args.params)
    print(f"{args.params}: valid, {len(expand_encoders(params['models']))} encoders")
    return 0


def _params_doc(args: argparse.Namespace) -> int:
    from .params import parameters_markdown

    print(parameters_markdown(), end="")
    return 0


def _encoders(args: argparse.Namespace) -> int:
    from .encoders.variants import expand_encoders
    from .params import load_params

    for e, v in sorted(expand_encoders(load_params(args.params)["models"]).items()):
        print("\t".join(str(x) for x in (e, v.model, v.layer, v.pooling, v.dim)))
    return 0


def _targets_args(p: argparse.ArgumentParser) -> None:
    from .workflow.layout import LAYOUT

    p.add_argument("stage", choices=sorted(LAYOUT))
    p.add_argument("models", nargs="*", help="model ids (default: all)")


def _targets(args: argparse.Namespace) -> int:
    from .params import load_params
    from .workflow.layout import artifact_paths

    print("\n".join(artifact_paths(load_params(args.params)["models"], args.stage, args.models)))
    return 0


def _stage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="stage, e.g. map or embed@<model> (default: $DVC_STAGE, set by DVC)")


def _stage(args: argparse.Namespace) -> int:
    from .workflow.repro import run_stage

    return run_stage(Path(args.params).resolve().parent, args.name)


def _deps_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("stages", nargs="*", help="stages (default: every stage of dvc.yaml)")
    p.add_argument("--root", default=".", help="workflow root holding dvc.yaml, rules/, scripts/, src/")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 naming each way dvc.yaml's code deps are wrong")
    mode.add_argument("--write", action="store_true", help="rewrite the code deps in dvc.yaml (data deps kept)")
    mode.add_argument("--digest", action="store_true",
                      help="write every stage's code digest under results/code (the DVC stage 'code' runs it)")


def _deps(args: argparse.Namespace) -> int:
    from .workflow.deps import check_dvc_yaml, stage_code, write_digests, write_dvc_yaml
    from .workflow.stages import STAGES

    if args.check:
        problems = check_dvc_yaml(args.root)
        for line in problems:
            print(line)
        print("dvc.yaml: not what the stage registry generates; `encmap deps --write` writes it" if problems
              else "dvc.yaml: what the stage registry generates; every stage's code found")
        return 1 if problems else 0
    if args.digest:
        changed = write_digests(args.root)
        print(f"code digests: {len(changed)} changed" + (f" ({', '.join(changed)})" if changed else ""))
        return 0
    if args.write:
        changed = write_dvc_yaml(args.root)
        print("dvc.yaml: written from the stage registry" if changed else "dvc.yaml: already what the registry generates")
        return 0
    for stage in args.stages or list(STAGES):
        print(f"{stage}:")
        print("".join(f"  - {f}\n" for f in stage_code(args.root, stage)), end="")
    return 0


def _repro_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", help="stages to bring up to date with their upstream (default: all)")
    p.add_argument("-n", "--dry-run", action="store_true", help="list the stale stages, run nothing")


def _repro(args: argparse.Namespace) -> int:
    from .workflow.repro import repro

    return repro(Path(args.params).resolve().parent, args.targets, args.snakemake_args, args.dry_run)


def _record(args: argparse.Namespace) -> int:
    from .workflow.repro import record

    return record(Path(args.params).resolve().parent)


def _params_slices(args: argparse.Namespace) -> int:
    from .params import check_mteb_targets, load_params
    from .workflow.deps import write_slices

    params = load_params(args.params)
    check_mteb_targets(params, args.params)  # DVC's first stage: before any job
    changed = write_slices(Path(args.params).resolve().parent, params)
    print(f"params slices: {len(changed)} changed" + (f" ({', '.join(changed[:10])}"
          + (", ..." if len(changed) > 10 else "") + ")" if changed else ""))
    return 0


def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path")


def _show(args: argparse.Namespace) -> int:
    import json

    from .io import read_h5

    print(json.dumps(read_h5(args.path, [])[1], indent=2, default=str))
    return 0


def _place_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="hub id (org/name or hub:ID), path:DIR or package:NAME")
    p.add_argument("--id", help="model id (default: from the source's last component)")
    p.add_argument("--spec", help="YAML file with a full params.yaml model entry (source and meta taken from it)")
    p.add_argument("--backend", default="sentence-transformers", choices=["sentence-transformers", "transformers"])
    p.add_argument("--layers", default="", help="hidden states to pool as well, e.g. 0,3,6 (default: output only)")
    p.add_argument("--pooling", default="mean", help="poolings of those layers, e.g. mean,cls,max")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="metadata (family, architecture, parameters, languages, objective, kind); repeatable")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the checkpoint's own Python code to run (off unless given)")
    p.add_argument("--append", action="store_true", help="add the entry to the params file for the next full run")
    p.add_argument("--out", help="output directory, none of the pipeline's (default: results/place/<id>)")
    p.add_argument("--device", default="auto", help="cuda | mps | cpu | auto (default)")


def _regress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--features", required=True, help="feature matrix (HDF5, e.g. results/features/qre.h5)")
    p.add_argument("--scores", required=True, help="score table CSV with columns encoder,task,score")
    p.add_argument("--groups", help="CSV encoder,group (default: each encoder's model)")
    p.add_argument("--out", help="also write the table to this CSV file")
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                   help="worker processes for the fits (default: the cores this process may use; "
                        "the table does not depend on it)")


def _regress(args: argparse.Namespace) -> int:
    from .downstream.prediction import regress_tables
    from .io import atomic_write_text
    from .params import load_params

    text = regress_tables(args.features, args.scores, args.groups, load_params(args.params)["regress"], args.jobs)
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0


def _count(text: str) -> float:
    """A finite number >= 0 (argparse type): a parameter count."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a parameter count is a finite number >= 0")
    return v


def _positive_int(text: str) -> int:
    """An integer >= 1 (argparse type)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count of at least 1")
    return v


def _check_catalogue_out(out: Path) -> None:
    """Refuse to replace an existing file that is not a catalogue (a ``models:`` block alone): a
    params file given as ``--out`` would lose everything but its models."""
    import yaml

    if not out.exists():
        return
    if out.is_dir():
        raise EncmapError(f"encmap catalogue: --out {out} is a directory; name a file")
    try:
        data = yaml.safe_load(out.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        data = None
    if not (isinstance(data, dict) and set(data) == {"models"}):
        keys = ", ".join(sorted(map(str, data))[:6]) if isinstance(data, dict) else "not a YAML mapping"
        raise EncmapError(f"encmap catalogue: --out {out} exists and is not a catalogue file (it holds: {keys}); "
                          "it would be replaced by a bare models: block. Use --append to add the entries to the "
                          "params file (--replace to replace its models), or name another file")


def _catalogue_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-params", type=_count, help="at least this many parameters (e.g. 1e8)")
    p.add_argument("--max-params", type=_count, help="at most this many parameters")
    p.add_argument("--language", action="append", default=[], metavar="ISO639-3",
                   help="models covering this language (e.g. eng); repeatable: any of them")
    p.add_argument("--english-only", action="store_true", help="models whose languages are English alone")
    p.add_argument("--org", action="append", default=[], help="organisation (the hub id's owner); repeatable")
    p.add_argument("--name", help="regular expression the hub name must match")
    p.add_argument("--framework", help="a framework the registry lists, e.g. 'Sentence Transformers'")
    p.add_argument("--limit", type=_positive_int, help="the first N entries by id")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="include models whose loader runs the checkpoint's own code (left out otherwise)")
    p.add_argument("--prompt", choices=["none", "document"], default="none",
                   help="probe sentences bare (default) or with the model's documented passage prompt")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="auto: float32 below 1 B parameters, bfloat16 from 1 B (default)")
    p.add_argument("--results", help="a local copy of MTEB's results repository: the registry's widths and parameter "
                                     "counts are checked against its model_meta.json files (default: "
                                     "regress.mteb.results when that is a local path)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--out", help="write a YAML file holding just models: (snakemake --configfile adds them)")
    out.add_argument("--append", action="store_true", help="add the entries to the params file (--params)")
    p.add_argument("--replace", action="store_true", help="with --append: replace the params file's models")


def _catalogue(args: argparse.Namespace) -> int:
    import yaml

    from .downstream.mteb_results import model_metas
    from .encoders.catalogue import catalogue, check_metadata, composition, registry_records
    from .io import atomic_write_text
    from .params import append_models, load_params, validate_params

    if args.out:
        _check_catalogue_out(Path(args.out))
    entries, left = catalogue(registry_records(), trust_remote_code=args.trust_remote_code, limit=args.limit,
                              prompt=args.prompt, dtype=args.dtype, min_params=args.min_params,
                              max_params=args.max_params, languages=args.language, english_only=args.english_only,
                              organisations=args.org, name_pattern=args.name, framework=args.framework)
    if not entries:
        raise EncmapError("encmap catalogue: no registry record passes these filters")
    results = args.results or load_params(args.params)["regress"]["mteb"]["results"]
    conflicts = None
    if results and results != "remote":
        conflicts = check_metadata(entries, model_metas(results, [e["meta"]["mteb_name"] for e in entries.values()]))
    if args.replace and not args.append:
        raise EncmapError("encmap catalogue: --replace replaces the params file's models, so it needs --append")
    if args.append:  # validated as the new params file before it replaces the old one
        append_models(args.params, entries, replace=args.replace)
    else:  # every entry as the run will see it (merged by snakemake --configfile), before writing
        base = load_params(args.params)
        validate_params(base | {"models": base["models"] | entries}, "encmap catalogue entries")
    text = yaml.safe_dump({"models": entries}, sort_keys=False, default_flow_style=None, width=120)
    if args.out:
        atomic_write_text(args.out, text)
    elif not args.append:
        print(text, end="")
    out = sys.stderr if not (args.append or args.out) else sys.stdout
    print(f"encmap catalogue: {len(entries)} models; left out {sum(left.values())}: "
          + (", ".join(f"{n} {why}" for why, n in left.most_common()) or "none"), file=out)
    for what, counts in composition(entries).items():
        print(f"  by {what}: " + ", ".join(f"{k} {n}" for k, n in counts.most_common(12))
              + (f", ... ({len(counts)} in all)" if len(counts) > 12 else ""), file=out)
    if conflicts is None:
        print("  registry metadata not checked: give --results (a local copy of MTEB's results)", file=out)
    else:
        print(f"  registry metadata contradicted by {results}'s model_meta.json: {len(conflicts)} models "
              "(written null; meta.metadata_conflicts has both)", file=out)
        for key, found in sorted(conflicts.items()):
            print(f"    {key}: " + "; ".join(f"{f} " + ", ".join(f"{v} ({src})" for src, v in by.items())
                                           for f, by in found.items()), file=out)
    return 0


def _mteb_scores_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="MTEB's results repository (a local copy: results/<org__model>/<revision>/"
                                   "<Task>.json beneath it), or 'remote' (online, through mteb's cache)")
    p.add_argument("--models", required=True,
                   help="CSV encoder,mteb_model[,revision]: which map encoder each MTEB model is; an empty revision "
                        "is the registry's pinned one")
    p.add_argument("--benchmark", default="MTEB(eng, v1)", help="benchmark whose tasks and subsets (default: "
                                                                "%(default)s)")
    p.add_argument("--tasks", nargs="+", default=[], metavar="TASK", help="these tasks instead (every subset)")
    p.add_argument("--split", default=None,
                   help="read this split for every task (default: each task's own evaluation splits, e.g. dev "
                        "for MSMARCO)")
    p.add_argument("--out", help="write the table here (default: print it)")
    p.add_argument("--sources", help="write the sources report here (JSON: per model its revision folders, "
                                     "tasks scored, tasks missing and why)")


def _mteb_scores(args: argparse.Namespace) -> int:
    from .downstream.mteb_results import published_scores
    from .downstream.score_tables import read_models_table, score_table_text
    from .io import atomic_write_json, atomic_write_text

    models = read_models_table(args.models)
    pub = published_scores(models, results=args.results, benchmark=args.benchmark, tasks=args.tasks,
                           split=args.split)
    print(pub.summary(), file=sys.stderr)
    if args.sources:
        atomic_write_json(args.sources, pub.report())
    if not pub.rows():
        raise EncmapError(f"MTEB results {args.results}: no score for any of {len(models)} models "
                          + (f"(why: {args.sources})" if args.sources else "(--sources FILE says why)"))
    text = score_table_text(pub.rows())
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    return 0


def _meta_value(key: str, value: str) -> Any:
    """A ``--meta KEY=VALUE`` value: languages a list, ASCII digits a number (``²`` or ``٣`` are digits to
    ``str.isdigit`` but not to ``int``, and Python reads no integer of over 4,300 digits), else the text."""
    import re

    from .validation import shown

    if key == "languages":
        return [x for x in value.split(",") if x]
    if not re.fullmatch(r"[0-9]+", value):
        return value
    if len(value) > 30:
        raise EncmapError(f"--meta {key}={shown(value)}: a number of {len(value):,} digits; give a count that means "
                          "something (parameters, width, release_year)")
    return int(value)


def _place(args: argparse.Namespace) -> int:
    import yaml

    from .params import append_models, takes_key
    from .place import default_model_id, place_encoder, place_spec, source_ref

    if args.spec:
        try:
            spec = yaml.safe_load(open(args.spec, encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise EncmapError(f"--spec {args.spec}: {e}") from None
        if not isinstance(spec, dict):
            raise EncmapError(f"--spec {args.spec}: expected a mapping (one params.yaml model entry)")
        if takes_key(spec, "source"):  # a served encoder (backend openai) has none: SOURCE then names it
            spec = spec | {"source": source_ref(args.source)}
        if args.trust_remote_code:
            spec["trust_remote_code"] = True
    else:
        meta: dict = {}
        for kv in args.meta:
            key, sep, value = kv.partition("=")
            if not sep:
                raise EncmapError(f"--meta {kv!r}: expected KEY=VALUE")
            meta[key] = _meta_value(key, value)
        try:
            layers = [int(x) for x in args.layers.split(",") if x.strip()]
        except ValueError:
            raise EncmapError(f"--layers {args.layers!r}: expected hidden-state numbers separated by commas, "
                              "e.g. 0,3,6") from None
        spec = place_spec(args.source, backend=args.backend, layers=layers,
                          pooling=[x for x in args.pooling.split(",") if x], meta=meta,
                          trust_remote_code=args.trust_remote_code)
    model = args.id or default_model_id(spec.get("source") or args.source)
    res = place_encoder(model, spec, params_path=args.params, out_dir=args.out, device=args.device)
    for i, e in enumerate(res["ids"]):
        x, y = res["coords"][i]
        twin = res["same_as"][e]
        print(f"{e}\tat ({x:.3f}, {y:.3f})" + (f"\tthe same encoder as {twin} (drawn on it)" if twin else ""))
        for r, (nb, d) in enumerate(res["neighbours"][e], start=1):
            print(f"  {r:2d}. {nb}\t{d:.6g}")
    if res["predicted"]:
        held, bounds = res.get("heldout") or {}, res.get("intervals") or {}
        level = next((b["level"] for by_t in bounds.values() for b in by_t.values()), None)
        print(f"predicted main scores (ridge, then elasticnet, on the {res['predictor']} features, trained on the "
              "map's encoders" + (f"; [low, high]: ridge's {level:.0%} conformal interval over held-out models"
                                  if level else "")
              + ("; ± the regressor's mean absolute error on that task with the model held out" if held else "")
              + "; EXTRAPOLATING: the encoder or its prediction lies outside what the regressor was fitted on):")

        def err(t: str, reg: str) -> str:
            mae = held.get(t, {}).get(reg, {}).get("mae")
            return "" if mae is None or mae != mae else f" ± {mae:.3f}"

        for e in res["ids"]:
            print(e)
            for t, p in res["predicted"][e].items():
                b = bounds.get(e, {}).get(t)
                shown = b and b["low"] == b["low"]  # NaN: too few encoders for an interval at the level
                print(f"  {t}\t{p['ridge']:.3f}" + (f" [{b['low']:.3f}, {b['high']:.3f}]" if shown else "")
                      + f"{err(t, 'ridge')}\telasticnet {p['elasticnet']:.3f}{err(t, 'elasticnet')}"
                      + (f"\tEXTRAPOLATING: {b['extrapolating']}" if b and b["extrapolating"] else ""))
    else:
        print("no predicted scores: results/regression/regressors.h5 not found (run the 'regress' rule)")
    print(f"wrote {res['out_dir']}/map.html, placed.csv, neighbours.csv" + (", scores.csv" if res["predicted"] else ""))
    if args.append:
        append_models(args.params, {model: spec})
        print(f"added model {model!r} to {args.params}")
    return 0


#: Every command, in the order ``encmap --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    Command("check", _check, help="validate the params file against the schema"),
    Command("params-doc", _params_doc,
            help="every params.yaml key with its type and description (docs/parameters.md)"),
    Command("encoders", _encoders, help="list every encoder: id, model, layer, pooling, dim (TSV)"),
    Command("targets", _targets, _targets_args, help="per-encoder Snakemake targets of one stage"),
    Command("stage", _stage, _stage_args,
            description="run one DVC stage's Snakemake job (the command of every stage in dvc.yaml)"),
    Command("deps", _deps, _deps_args,
            help="the code each DVC stage runs (its code digest); --check, --write dvc.yaml"),
    Command("repro", _repro, _repro_args,
            help="run every stage DVC finds stale in one Snakemake call; record them in dvc.lock",
            description="encmap repro [STAGE ...] [-n] [-- SNAKEMAKE ARGS]: what `dvc repro` does, "
                        "with one Snakemake process instead of one per stage"),
    Command("record", _record, help="record in dvc.lock what a plain `snakemake` run made (no job runs)",
            description="encmap record: after `snakemake --cores all`, record in dvc.lock, as `dvc commit` "
                        "would, every stale stage whose outputs a Snakemake job made from the current code, "
                        "params and inputs (proven from what each job recorded when it finished, never from "
                        "file times); every other stale stage is named and stays stale. A plain run in a DVC project "
                        "does this itself as it ends: this is for a run made elsewhere (a cluster's submit host)"),
    Command("params-slices", _params_slices,
            description="write each stage's params slice under results/params (the DVC stage 'params' runs it)"),
    Command("show", _show, _show_args, help="print an artifact's attributes (JSON)"),
    Command("place", _place, _place_args,
            help="place a new encoder on the run's map (no refit) and list its neighbours"),
    Command("regress", _regress, _regress_args,
            help="predict scores from features: grouped vs random CV, baselines (CSV table)"),
    Command("catalogue", _catalogue, _catalogue_args,
            help="models: entries for hub encoders from MTEB's model registry (offline)"),
    Command("mteb-scores", _mteb_scores, _mteb_scores_args,
            help="score table (encoder,task,score) from MTEB's published results (the regress stage's reader)"),
)


if __name__ == "__main__":
    sys.exit(main())
