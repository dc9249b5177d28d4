"""What a plain `snakemake` run made, DVC records (`encmap record`): then `dvc status` is clean,
`encmap repro` runs nothing, `dvc exp run -S` reruns one stage, `dvc push` / `dvc pull` carry the
results; and nothing that was not made from the current code, params and inputs is recorded:
each hostile case is named as stale (issue 50)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.project import ran, run, tree_hashes, with_param

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def made(snakemade) -> Path:
    """Ten control models through plain `snakemake --cores 2` (the README's command 1), committed
    (conftest's ``snakemade``: tests change only copies of it)."""
    return snakemade


def copy(made: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "p"
    shutil.copytree(made, dst, symlinks=True)
    return dst


def stale(proj: Path) -> set[str]:
    return set(json.loads(run("dvc status --json", proj).stdout))


def still_stale(out: str) -> dict[str, str]:
    """`encmap record`'s list of what stays stale: stage -> why."""
    return dict(line.strip().removeprefix("still stale: ").split(": ", 1)
                for line in out.splitlines() if line.strip().startswith("still stale: "))


@pytest.mark.slow(minutes=3)
def test_a_plain_snakemake_run_is_recorded_and_then_shared_and_compared(made, tmp_path):
    """Old: after command 1, `encmap repro --dry-run` reported every stage stale and there was no
    dvc.lock, so `dvc push` had nothing to send and `dvc exp run -S map.perplexity=5` reran
    everything."""
    proj = copy(made, tmp_path)
    before = tree_hashes(proj, "data", "results")
    assert len(stale(proj)) > 40
    out = run("encmap record", proj).stdout
    assert "encmap record: " in out and not still_stale(out), out
    assert stale(proj) == set()
    assert "0 stale stages" in run("encmap repro -n", proj).stdout
    book = ("results/code/", "results/params/")  # the digests and slices record writes as DVC's bookkeeping does
    assert {k: v for k, v in tree_hashes(proj, "data", "results").items() if not k.startswith(book)} == \
        {k: v for k, v in before.items() if not k.startswith(book)}  # no artifact touched, no job run
    run("git add -A && git commit -qm recorded", proj)
    out = run("dvc exp run -S map.perplexity=2", proj).stdout
    assert ran(out) == {"map"}, out
    run("git checkout -q -- . && dvc checkout -q", proj)
    # Sharing: push to a remote, a fresh clone pulls the same bytes, up to date.
    run(f"dvc remote add -d store {tmp_path / 'remote'} && git add -A && git commit -qm remote && dvc push -q", proj)
    run(f"git clone -q {proj} {tmp_path / 'clone'}", tmp_path)
    run("dvc pull -q", tmp_path / "clone")
    assert tree_hashes(tmp_path / "clone", "data", "results") == tree_hashes(proj, "data", "results")
    assert stale(tmp_path / "clone") == set()


@pytest.mark.slow(minutes=2)
def test_nothing_that_was_not_made_from_the_current_inputs_is_recorded(made, tmp_path):
    """Each hostile case on its own copy: it is named as stale, the rest is recorded."""
    from encmap.workflow.made import MADE

    def case(name: str, edit) -> tuple[dict[str, str], set[str]]:
        proj = copy(made, tmp_path / name)
        edit(proj)
        out = run("encmap record", proj).stdout
        return still_stale(out), stale(proj)

    def touch_output(proj):  # an output edited after the run
        f = proj / "results/map/coords.csv"
        f.write_text(f.read_text().replace(",", ", ", 1))

    left, dvc = case("edited", touch_output)
    assert set(left) == {"map"} and left["map"].endswith("changed since its job wrote it"), left
    assert dvc == {"map"}

    def new_param(proj):  # a params value changed after the run, nothing rerun
        params = yaml.safe_load((proj / "params.yaml").read_text())
        (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "models.ctl-0003.seed", 99),
                                                         sort_keys=False))

    left, dvc = case("param", new_param)
    assert left["embed@ctl-0003"].endswith("made with other params than params.yaml's now"), left
    assert {k for k in left if not k.startswith(("pip@ctl-0003", "features@ctl-0003", "evaluate@ctl-0003"))} == \
        {"embed@ctl-0003", "gather", "pairwise", "cka_rbf", "stitch", "agreement", "map", "regress"}, left
    assert set(left) == dvc

    def new_code(proj):  # the code a stage runs changed
        f = proj / "src/encmap/maps/tsne.py"
        f.write_text(f.read_text() + "\n# an edited comment\n")

    left, dvc = case("code", new_code)
    assert set(left) == {"map"} and left["map"].endswith("made by other code than the stage's now"), left

    def damaged(proj):  # an artifact damaged behind the pipeline's back
        f = proj / "results/embeddings/ctl-0005/ctl-0005__out.h5"
        f.write_bytes(f.read_bytes()[:200])

    left, dvc = case("damaged", damaged)
    assert left["embed@ctl-0005"].endswith("changed since its job wrote it"), left
    assert "pip@ctl-0005" in left and "gather" in left

    def failed(proj):  # a job that failed left its previous output (update()): not made by this params
        params = yaml.safe_load((proj / "params.yaml").read_text())
        (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "map.seed", 5), sort_keys=False))
        qre = proj / "results/features/qre.h5"
        good = qre.read_bytes()
        qre.write_bytes(good[:300])  # the map job fails reading it
        r = run("snakemake --cores 2 --allowed-rules map results/map/coords.csv", proj, check=False)
        assert r.returncode != 0
        qre.write_bytes(good)

    left, dvc = case("failed", failed)
    assert set(left) == {"map"} and left["map"].endswith("made with other params than params.yaml's now"), left

    def interrupted(proj):  # a run stopped halfway (here: at pip) after a seed change
        new_param(proj)
        run("snakemake --cores 2 --until pip", proj)

    left, dvc = case("interrupted", interrupted)
    assert "embed@ctl-0003" not in left and "pip@ctl-0003" not in left, left  # made by this run: recorded
    assert "its input results/" in left["features@ctl-0003"], left
    assert "gather" in left and set(left) == dvc

    def no_ledger(proj):  # nothing recorded what made the files: nothing can be shown made
        (proj / MADE).unlink()

    left, dvc = case("ledger", no_ledger)
    assert set(left) == dvc and len(dvc) > 40 and all("no job of a Snakemake run made it" in w or "above it" in w
                                                      for w in left.values())
