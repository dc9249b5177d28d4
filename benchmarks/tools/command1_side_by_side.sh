#!/bin/bash
# Command 1 (README) for two commits, one after the other, each from a fresh clone of this
# repository, each with an empty made-model cache (ENCMAP_CACHE: a new folder holding only a link
# to the unpacked all-mpnet-base-v2, which takes minutes to unpack and is not what is measured).
# Run it alone on the machine: the figures are only comparable side by side.
#   bash benchmarks/tools/command1_side_by_side.sh BASE_COMMIT NEW_COMMIT [WORKDIR]
# Prints one line per commit (install, snakemake and total seconds), then the job time per rule of
# both runs (benchmarks/tools/rule_times.py over their Snakemake logs, which stay in WORKDIR/<commit>).
set -u
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=${3:-/tmp/encmap-command1}
mpnet=${ENCMAP_CACHE:-$HOME/.cache/encmap}/all-mpnet-base-v2
mkdir -p "$work"
for commit in "$1" "$2"; do
  d=$work/$commit
  rm -rf "$d" "$d.cache" && mkdir -p "$d.cache"
  [ -d "$mpnet" ] && ln -s "$mpnet" "$d.cache/all-mpnet-base-v2"
  git clone -q "$repo" "$d" && git -C "$d" checkout -q "$commit" || exit 1
  t0=$(date +%s)
  (cd "$d" && ENCMAP_CACHE=$d.cache bash install.sh) > "$d.install.log" 2>&1; rc1=$?
  t1=$(date +%s)
  (cd "$d" && . .venv/bin/activate && ENCMAP_CACHE=$d.cache /usr/bin/time -v snakemake --cores all) > "$d.run.log" 2>&1; rc2=$?
  t2=$(date +%s)
  echo "$commit install=$((t1 - t0))s (rc $rc1) snakemake=$((t2 - t1))s (rc $rc2) total=$((t2 - t0))s $(date -Is)"
done
python3 "$repo/benchmarks/tools/rule_times.py" "$work/$1"/.snakemake/log/*.snakemake.log "$work/$2"/.snakemake/log/*.snakemake.log
