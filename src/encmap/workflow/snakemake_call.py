"""One Snakemake call for ``encmap repro``: the options it may pass, and what the call made.

What ``encmap repro`` records in ``dvc.lock`` as current must be what this call made. Two
things decide it, both from Snakemake itself rather than from what is on disk afterwards:

- **The options.** Only options that cannot change which jobs run, what they compute or with
  which config (:data:`ALLOWED`: cores, jobs, resources, where jobs run, keep-going, printing)
  pass; they are parsed with Snakemake's own argument parser, so every spelling Snakemake
  accepts (``-pt``, ``--tou``, ``--executor touch``) is judged as Snakemake reads it. The same
  holds for the profile's keys (``--profile``, ``SNAKEMAKE_PROFILE``, the workflow's default).
- **The jobs that ran.** The call runs in a child process whose Snakefile records in the ledger
  every output a job ran and wrote, as Snakemake declares the job finished (:mod:`.made`). A
  stage is made when every target has such a row from this call and still holds that content
  when the call ends: a failed job whose ``update()`` output Snakemake put back, a job that never
  ran or wrote nothing, or a file changed after its job are not.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from pathlib import Path

from ..validation import EncmapError

#: Snakemake options (their argparse ``dest``) that ``encmap repro`` passes on: where and how many
#: jobs run at once, how failures and output are reported. None changes which jobs run, what they
#: compute, or the config they see.
ALLOWED = frozenset({
    "cores", "jobs", "local_cores", "resources", "set_resource_scopes", "default_resources", "set_resources",
    "profile", "workflow_profile", "executor", "keep_going", "printshellcmds", "verbose", "quiet", "nocolor",
    "show_failed_logs", "latency_wait", "max_jobs_per_second", "max_jobs_per_timespan",
    "max_status_checks_per_second", "seconds_between_status_checks", "retries", "preemptible_retries",
    "preemptible_rules", "jobname", "scheduler", "scheduler_greediness", "scheduler_greedy_greediness",
    "scheduler_ilp_solver", "scheduler_subsample", "groups", "group_components", "logger", "force_use_threads",
    "shared_fs_usage", "local_storage_prefix", "remote_job_local_storage_prefix", "max_inventory_time",
    "debug",
})
#: Options encmap repro sets itself to the same effect (the default profile says rerun-incomplete
#: too). Its targets, --allowed-rules and --rerun-triggers are its own: a user's would replace them.
OWN = frozenset({"rerun_incomplete", "nolock", "force"})
#: Executor plugins' own options (``--slurm-...``): where and how jobs are submitted.
PLUGIN_PREFIXES = ("slurm_", "cluster_generic_", "kubernetes_", "googlebatch_", "lsf_", "pbs_", "aws_batch_")
#: Executors that run no job.
NO_JOB_EXECUTORS = ("touch", "dryrun")


@functools.lru_cache(maxsize=1)
def _parser():
    """Snakemake's own argument parser (built once: it loads every plugin, ~2 s of CPU)."""
    from snakemake.cli import get_argument_parser

    return get_argument_parser()


def _allowed(dest: str) -> bool:
    return dest in ALLOWED or dest in OWN or dest.startswith(PLUGIN_PREFIXES)


def _check_value(dest: str, value, where: str) -> None:
    if dest == "executor" and value in NO_JOB_EXECUTORS:
        raise EncmapError(f"encmap repro: {where}: executor {value!r} runs no job, and what encmap repro runs is "
                          "recorded in dvc.lock as made; `encmap repro --dry-run` lists what would run")
    if dest in ("cores", "jobs", "local_cores") and value is not None:
        text = str(value).strip()
        if text != "all" and not (text.isdigit() and int(text) >= 1):
            raise EncmapError(f"encmap repro: {where}: {dest.replace('_', '-')} {value!r} must be 'all' or a "
                              "whole number >= 1 (Snakemake waits forever with 0 cores)")


def check_args(args: list[str]) -> None:
    """Refuse Snakemake options that ``encmap repro`` may not pass, read as Snakemake reads them.

    Raises :class:`EncmapError` naming the option (as the user wrote it where it can be found) and why.
    """
    if not args:
        return
    parser = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            given = vars(parser.parse_args(args))
    except SystemExit:
        why = err.getvalue().strip().splitlines()[-1:] or ["not a Snakemake option"]
        raise EncmapError(f"encmap repro: Snakemake cannot read the options {' '.join(args)!r}: "
                          f"{why[0].removeprefix('-: ')}") from None
    except Exception as e:  # noqa: BLE001 (a value Snakemake's own parser refuses: -j all)
        raise EncmapError(f"encmap repro: Snakemake cannot read the options {' '.join(args)!r}: {e}") from None
    default = vars(parser.parse_args([]))
    for dest, value in given.items():
        if _same(value, default.get(dest)):
            continue
        if not _allowed(dest):
            raise EncmapError(
                f"encmap repro: Snakemake option --{dest.replace('_', '-')} (read from {' '.join(args)!r}) may "
                "change which jobs run, what they compute or with which config, and what encmap repro runs is "
                "recorded in dvc.lock as made from params.yaml. It passes only where and how many jobs run "
                "(cores, jobs, resources, profile, executor, keep-going, printing); `encmap repro --dry-run` lists "
                "what would run, and plain `snakemake` takes any option")
        _check_value(dest, value, f"option --{dest.replace('_', '-')}")


def _same(a, b) -> bool:
    """``a == b`` for parsed option values (Snakemake's ``Batch`` cannot be compared with None)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def check_profiles(args: list[str], root: Path, environ: dict | None = None) -> None:
    """Refuse a profile whose settings :func:`check_args` would not pass, judged as Snakemake reads
    them: its own resolution (``--profile``, ``SNAKEMAKE_PROFILE``, the workflow profile, a folder or
    a file, ``profile.yaml``, ``config.yaml`` and their ``.vN+`` forms) and its own parser.

    Each profile file Snakemake will read is named with the key that is refused; and whatever the
    spelling, every option whose value the profiles change from the command line's must be allowed.
    """
    from snakemake import cli
    from snakemake.profiles import ProfileConfigFileParser

    env = dict(os.environ if environ is None else environ)
    used: list = []
    build = cli.get_argument_parser

    def recording(profiles=None):  # the profiles Snakemake's second pass reads, in its order
        used.extend(profiles or [])
        return build(profiles=profiles)

    err = io.StringIO()
    saved_env, cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(root)
        cli.get_argument_parser = recording
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _, effective = cli.parse_args(list(args))
        files = [Path(cli.get_profile_dir(str(p))[1]) for p in used]
    except SystemExit:
        why = [line for line in err.getvalue().splitlines() if line.strip()][-1:] or ["unreadable"]
        raise EncmapError(f"encmap repro: Snakemake cannot read its profile: {why[0]}") from None
    except Exception as e:  # noqa: BLE001 (a profile Snakemake's own parser refuses)
        raise EncmapError(f"encmap repro: Snakemake cannot read its profile: {type(e).__name__}: {e}") from None
    finally:
        cli.get_argument_parser = build
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    for f in files:
        with f.open(encoding="utf-8") as stream:
            data = ProfileConfigFileParser().parse(stream)
        for key, value in data.items():
            dest = str(key).replace("-", "_")
            if not _allowed(dest):
                raise EncmapError(f"encmap repro: profile {f}: key {key!r} may change which jobs run, what they "
                                  "compute or with which config, and what encmap repro runs is recorded in dvc.lock "
                                  "as made from params.yaml; a profile for encmap repro says only where and how many "
                                  "jobs run (cores, jobs, resources, executor and its settings, keep-going, printing)")
            _check_value(dest, value, f"profile {f}: key {key!r}")
    given = vars(_parser().parse_args(list(args)))
    for dest, value in vars(effective).items():
        if not _same(value, given.get(dest)) and not _allowed(dest):  # however the profiles spelled it
            raise EncmapError(f"encmap repro: the profiles {', '.join(map(str, files))} set Snakemake's "
                              f"--{dest.replace('_', '-')}, which may change which jobs run or what they compute")


def run_snakemake(argv: list[str] | str, checked: bool = False) -> int:
    """Snakemake's command line ``argv`` in this process (the working directory is the project's),
    or the one in file ``argv`` (a JSON list: ``encmap repro``'s child, whose targets at the
    catalogue's scale outgrow the kernel's argument limit): its profiles checked as Snakemake reads
    them (:func:`check_profiles`: ``encmap stage`` under ``dvc repro`` checks nothing before;
    ``checked``: already done in this process, by :func:`serve`). Returns Snakemake's exit status
    (2: a profile refused)."""
    from snakemake.cli import main

    if isinstance(argv, str):
        with open(argv, encoding="utf-8") as f:
            argv = json.load(f)
    if not checked:
        try:
            check_profiles(argv, Path.cwd())
        except EncmapError as e:
            print(f"encmap: {e}", file=sys.stderr)
            return 2
    try:
        main(argv)
    except SystemExit as e:  # Snakemake's main always exits
        return e.code if isinstance(e.code, int) else 1
    return 0


def serve(verdict_fd: int, args: list[str]) -> int:
    """``encmap repro``'s first child, started before the parent reads DVC's status: it imports
    Snakemake and judges the user's options and profiles (:func:`check_args`, :func:`check_profiles`),
    writes the verdict to ``verdict_fd`` (a JSON object, ``refused``: the refusal or ``""``), then
    waits on stdin for one call (a JSON line ``{"argv_file": ...}``) and runs it.
    End of input (nothing to run, or the parent gone) ends it. Snakemake is so imported once per
    call, in the process that runs it (the parent used to import it too, to check: ~1.5 s of CPU)."""
    try:
        check_args(args)
        check_profiles(args, Path.cwd())
        refused = ""
    except EncmapError as e:
        refused = str(e)
    try:
        with os.fdopen(verdict_fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({"refused": refused}))
    except BrokenPipeError:  # the parent stopped before reading it
        return 1
    if refused:
        return 2
    try:
        line = sys.stdin.readline()
    except KeyboardInterrupt:  # the user's Ctrl-C reached the parent too: it reports it
        return 130
    if not line.strip():
        return 0
    call = json.loads(line)
    return run_snakemake(call["argv_file"], checked=True)


if __name__ == "__main__":  # python -m encmap.workflow.snakemake_call (ARGV_FILE | --serve FD ARGS_JSON)
    if sys.argv[1] == "--serve":
        sys.exit(serve(int(sys.argv[2]), json.loads(sys.argv[3])))
    sys.exit(run_snakemake(sys.argv[1]))
