"""Choice of the torch device, and one GPU per job on a machine with several.

``resolve_device``: cuda > mps > cpu unless the user names one.

On a CUDA machine with several GPUs, every job that runs on a GPU gets one of its own:

- :func:`gpu_count` is how many GPUs the workflow may keep busy (``ENCMAP_GPUS``, else the
  entries of ``CUDA_VISIBLE_DEVICES``, else the GPUs the driver lists), found without importing
  torch; the Snakefile makes it the ``gpu`` resource limit, so Snakemake never starts more GPU
  jobs at once than there are GPUs (``--resources gpu=N`` overrides it).
- :func:`job_device` hands a job a free GPU (``cuda:i``), held by an exclusive ``flock`` on a
  lock file named after the card for as long as the job runs, and makes it the calling thread's
  current CUDA device (CUDA's current device is per host thread, so in-process jobs running in
  Snakemake's threads each get their own). A lock file is released by the kernel when its
  holder exits, however it exits: a killed job never leaves a GPU taken. The same locks keep
  two Snakemake runs on one machine (``dvc --wait-for-lock repro -s`` in parallel, two users'
  shells) off each other's cards.
- A model whose weights alone do not fit a card's memory is refused before it is loaded, naming
  the model, its parameters and dtype, and the card.

``mps`` and CPU-only machines are unchanged: one device, no locks, no limit.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .validation import EncmapError, shown

log = logging.getLogger("encmap")

#: Environment variable: how many GPUs encmap's jobs may use (an integer ≥ 0); overrides detection.
GPUS_ENV = "ENCMAP_GPUS"
#: The largest count ``ENCMAP_GPUS`` may give: more than any machine has (a count beyond the cards
#: means "all of them"), small enough that a stray paste is refused, not read as a number.
MAX_GPUS = 1_000_000
#: Environment variable: the folder of the per-GPU lock files (default: a per-user folder in the
#: system's temporary directory, shared by every encmap process of that user on the machine).
LOCK_DIR_ENV = "ENCMAP_GPU_LOCK_DIR"
#: How often a job that finds every GPU taken (by another run) looks again, in seconds.
POLL_SECONDS = 2.0
#: How long a job waits while every card it may use is free of encmap jobs but short of free
#: memory (another program holds it) before it is refused, naming the cards, in seconds.
MEMORY_WAIT_S = 600.0
#: Memory a card must keep beyond a model's weights (activations, the CUDA context, workspace):
#: a model is refused when its weights exceed this fraction of the card's memory.
WEIGHT_FRACTION = 0.9


def resolve_device(requested: str = "auto") -> str:
    """Return the device to run on.

    Parameters
    ----------
    requested : {"auto", "cuda", "mps", "cpu"} or a torch device string such as "cuda:1"
    """
    import torch

    if requested == "auto":
        if torch.cuda.is_available() and not gpus_disabled():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise EncmapError(f"embed.device is {requested!r} but torch sees no CUDA device")
    if requested.startswith("cuda") and gpus_disabled():
        raise EncmapError(f"embed.device is {requested!r} but {GPUS_ENV}=0 allows encmap's jobs no GPU; set the "
                          "device to auto or cpu, or unset it")
    if re.fullmatch(r"cuda:\d+", requested):
        usable = min(torch.cuda.device_count(), gpu_count())
        if int(requested[5:]) >= usable:
            raise EncmapError(f"embed.device is {requested!r} but encmap's jobs may use cuda:0 to cuda:{usable - 1} "
                              f"({torch.cuda.device_count()} visible, {GPUS_ENV}="
                              f"{os.environ.get(GPUS_ENV, 'unset')}); name one of those, or auto")
    if requested == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise EncmapError("embed.device is 'mps' but MPS is not available")
    return requested


def gpus_override(environ: dict | None = None) -> int | None:
    """The number ``ENCMAP_GPUS`` gives (None: unset or blank); an error naming the value unless
    it is ASCII digits (``00`` is 0: every reader of the variable reads it here, so a count of 0
    always means no GPU job; ``²``, ``٠`` or ``１`` are digits to Python's ``isdigit`` only) for
    at most :data:`MAX_GPUS` (checked on the digits: Python refuses to read an integer of more
    than 4,300 digits at all)."""
    env = os.environ if environ is None else environ
    raw = env.get(GPUS_ENV, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw):
        raise EncmapError(f"{GPUS_ENV}={shown(raw)}: expected a number of GPUs in ASCII digits (0, 1, 2, ...)")
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(MAX_GPUS)) or int(digits) > MAX_GPUS:
        raise EncmapError(f"{GPUS_ENV}={shown(raw)}: a number of GPUs of {len(digits):,} digits, more than the "
                          f"{MAX_GPUS:,} it may be; give the cards encmap's jobs may use (or unset it: all of them)")
    return int(digits)


def gpus_disabled(environ: dict | None = None) -> bool:
    """``ENCMAP_GPUS=0``: the user allows encmap's jobs no GPU (they run on the CPU and ask
    Snakemake for none). Read without asking the driver: rules call it for every job."""
    return gpus_override(environ) == 0


def _visible_entries(value: str) -> int:
    """GPUs a ``CUDA_VISIBLE_DEVICES`` value makes visible: CUDA reads entries up to the first invalid
    one (``-1`` or an empty value hides every GPU)."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-") or not re.fullmatch(r"[0-9]+|(GPU|MIG)-[0-9A-Za-z/-]+", entry):
            break
        count += 1
    return count


def _driver_gpus() -> int:
    """GPUs the NVIDIA driver lists on this machine (0 without one), without importing torch."""
    if "torch" in sys.modules:  # already paid for: ask it (it honours CUDA_VISIBLE_DEVICES itself)
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def gpu_count(environ: dict | None = None, driver_gpus: Callable[[], int] = _driver_gpus) -> int:
    """How many GPUs encmap's jobs may keep busy on this machine (0: none, or no CUDA).

    ``ENCMAP_GPUS`` if set (the user keeps some cards for other work, or a test simulates a
    count), else the GPUs the driver lists, capped by the entries of ``CUDA_VISIBLE_DEVICES``
    when that is set (SLURM sets it to a job's allocation).
    """
    env = os.environ if environ is None else environ
    override = gpus_override(env)
    if override is not None:
        return override
    found = driver_gpus()
    if "CUDA_VISIBLE_DEVICES" in env:
        found = min(found, _visible_entries(env["CUDA_VISIBLE_DEVICES"]))
    return found


def set_gpu_limit(workflow, environ: dict | None = None) -> int | None:
    """Make the number of GPUs (:func:`gpu_count`) Snakemake's ``gpu`` resource limit, unless the
    user gave one (``--resources gpu=N``, or a profile's ``resources``). Returns the limit set, or
    None when none is set (no CUDA GPU: CPU-only and mps machines are unchanged)."""
    if "gpu" in workflow.global_resources:
        return None
    n = gpu_count(environ)
    if n <= 0:
        return None
    workflow.global_resources["gpu"] = n
    return n


def lock_dir(environ: dict | None = None) -> Path:
    """The folder of the per-GPU lock files (:data:`LOCK_DIR_ENV`, else per user under the temp dir)."""
    env = os.environ if environ is None else environ
    if env.get(LOCK_DIR_ENV):
        path, named = Path(env[LOCK_DIR_ENV]), f"{LOCK_DIR_ENV}={env[LOCK_DIR_ENV]}"
    else:
        path = Path(tempfile.gettempdir()) / f"encmap-gpus-{os.getuid()}"
        named = f"the GPU lock folder {path} (set {LOCK_DIR_ENV} to choose another)"
    try:
        if not path.is_dir():
            path.mkdir(mode=0o700, parents=True)
    except OSError as e:
        why = "a file, not a folder" if path.is_file() else f"cannot make that folder ({e.strerror})"
        raise EncmapError(f"{named}: {why}; the per-GPU lock files live there, so name a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise EncmapError(f"{named}: not writable; the per-GPU lock files live there, so name a writable folder")
    return path


def _card_key(index: int) -> str:
    """A name for card ``index`` (as this process numbers them) that every process on the machine
    shares: its UUID, since under ``CUDA_VISIBLE_DEVICES`` (SLURM) two processes may both call
    different cards ``cuda:0``."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else f"index-{index}"


def _cuda_memory(index: int) -> tuple[int, int]:
    """(free, total) bytes of card ``index``."""
    import torch

    return torch.cuda.mem_get_info(index)


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None if another holder has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


@contextmanager
def gpu_slot(count: int, *, need_bytes: int | None = None, what: str = "this job",
             keys: Callable[[int], str] = lambda i: f"index-{i}",
             memory: Callable[[int], tuple[int, int]] | None = None,
             directory: Path | None = None, poll: float = POLL_SECONDS,
             only: int | None = None, memory_wait: float | None = None) -> Iterator[int]:
    """Hold a free GPU among ``count`` for the body of the ``with``; yields its index.

    The logic of :func:`job_device` without CUDA (tests drive it with simulated cards).

    Parameters
    ----------
    count : int
        Cards 0..count-1.
    need_bytes : int, optional
        Bytes the job's model weights take: a card whose total memory is below
        ``need_bytes / WEIGHT_FRACTION`` is never chosen, one whose free memory is below it is
        passed over while it is short. No card could ever hold it: :class:`EncmapError` at once.
    what : str
        The job, for messages ("model 'e5-mistral'").
    keys : callable
        Card index -> lock file name, shared by every process on the machine.
    memory : callable, optional
        Card index -> (free, total) bytes; needed with ``need_bytes``.
    only : int, optional
        The user named this card (``cuda:k``): wait for it alone.
    memory_wait : float, optional
        Seconds to wait while every card is free of encmap jobs but short of memory (another
        program holds it) before :class:`EncmapError` names the cards and their free memory
        (default :data:`MEMORY_WAIT_S`). Cards held by other encmap jobs are waited for without limit.
    """
    if only is None and count <= 0:  # nothing to wait for: waiting would never end
        raise EncmapError(f"{what}: no GPU may be used ({GPUS_ENV}={os.environ.get(GPUS_ENV, 'unset')}, "
                          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); set the "
                          "device to cpu, or allow a card")
    folder = lock_dir() if directory is None else directory
    cards = [only] if only is not None else list(range(count))
    need = None if need_bytes is None else need_bytes / WEIGHT_FRACTION
    if need is not None:
        totals = {i: memory(i)[1] for i in cards}
        if all(t < need for t in totals.values()):
            best = max(cards, key=lambda i: totals[i])
            raise EncmapError(
                f"{what}: its weights alone need {_gib(need_bytes)}, more than {WEIGHT_FRACTION:.0%} of the "
                f"largest card's {_gib(totals[best])} (cuda:{best}); not loaded. Use a lower dtype "
                "(bfloat16 halves float32's weights), a card with more memory, or leave it out")
        cards = [i for i in cards if totals[i] >= need]
    waited_since, said, short_since = time.monotonic(), 0.0, None
    limit = MEMORY_WAIT_S if memory_wait is None else memory_wait
    while True:
        short = []
        for i in cards:
            fd = try_lock(folder / f"{keys(i)}.lock")
            if fd is None:
                continue
            if need is not None:
                free = memory(i)[0]
                if free < need:  # another program holds this card's memory now
                    short.append((i, free))
                    os.close(fd)
                    continue
            try:
                yield i
            finally:
                os.close(fd)  # releases the flock
            return
        now = time.monotonic()
        short_since = (short_since or now) if short and len(short) == len(cards) else None
        if short_since is not None and now - short_since >= limit:
            raise EncmapError(
                f"{what}: no GPU has the {_gib(need)} free its weights need, and none did for {limit:.0f} s: "
                + ", ".join(f"cuda:{i} {_gib(f)} free of {_gib(totals[i])}" for i, f in short)
                + ". Another program holds their memory; free it, or run this model later")
        waited = now - waited_since
        if waited - said >= 60 or not said:
            said = max(waited, 1e-9)
            held = "every card is held by another encmap job" if not short else (
                "the free cards lack memory now: " + ", ".join(f"cuda:{i} {_gib(f)} free" for i, f in short))
            log.warning("%s: waiting for a GPU (%s; %s needed)", what, held,
                        _gib(need_bytes) if need_bytes else "one card")
        time.sleep(poll)


@contextmanager
def job_device(requested: str, *, gpu: bool, need_bytes: Callable[[], int | None] | None = None,
               what: str = "this job") -> Iterator[str]:
    """The device one job runs on, held for the body of the ``with``.

    ``requested`` is resolved (:func:`resolve_device`); a job that runs on a GPU (``gpu``) and
    resolves to CUDA gets a card of its own (:func:`gpu_slot`), made the calling thread's current
    device, and yields ``"cuda:i"``. ``need_bytes`` (called only then) gives its weights' bytes
    for the check that the model fits a card. Any other job yields the resolved device as it is.
    """
    dev = resolve_device(requested)
    if not (gpu and dev.startswith("cuda")):
        yield dev
        return
    import torch

    only = int(dev.split(":", 1)[1]) if ":" in dev else None
    weights = need_bytes() if need_bytes is not None else None
    # ENCMAP_GPUS=k: the first k visible cards, so a card the user kept stays free.
    with gpu_slot(min(torch.cuda.device_count(), gpu_count()), need_bytes=weights, what=what, keys=_card_key,
                  memory=_cuda_memory, only=only) as i:
        previous = torch.cuda.current_device()
        torch.cuda.set_device(i)  # this thread's current device: library code that says "cuda" lands here
        try:
            yield f"cuda:{i}"
        finally:
            torch.cuda.set_device(previous)
