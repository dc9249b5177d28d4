"""The ``encmap`` command line: targets, encoders, check, show, deps, params-doc; errors exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from encmap import cli
from encmap.io import write_h5

REPO = Path(__file__).resolve().parents[1]


def test_cli_targets_encoders_and_errors(tmp_path, capsys):
    params = REPO / "params.yaml"
    assert cli.main(["--params", str(params), "targets", "pip", "tfidf-svd"]) == 0
    assert capsys.readouterr().out.split() == ["results/pip/tfidf-svd/tfidf-svd__d128.h5",
                                               "results/pip/tfidf-svd/tfidf-svd__d512.h5"]
    assert cli.main(["--params", str(params), "targets", "features"]) == 0
    assert len(capsys.readouterr().out.split()) == 70
    assert cli.main(["--params", str(params), "encoders"]) == 0
    assert "minilm-l6__l06-cls\tminilm-l6\t6\tcls\tNone" in capsys.readouterr().out
    assert cli.main(["--params", str(params), "targets", "pip", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert cli.main(["--params", str(tmp_path / "missing.yaml"), "check"]) == 2
    assert "params file not found" in capsys.readouterr().err
    write_h5(tmp_path / "a.h5", {"x": np.zeros(2)}, {"encoder_id": "e"})
    assert cli.main(["show", str(tmp_path / "a.h5")]) == 0
    assert json.loads(capsys.readouterr().out)["encoder_id"] == "e"


def test_cli_deps_checks_dvc_yaml_and_prints_a_stage(capsys):
    assert cli.main(["deps", "--root", str(REPO), "--check"]) == 0
    assert "dvc.yaml: what the stage registry generates; every stage's code found" in capsys.readouterr().out
    assert cli.main(["deps", "--root", str(REPO), "gather"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gather:" and "  - src/encmap/pipeline/gather.py" in out and "  - rules/gather.smk" in out
    assert cli.main(["deps", "--root", str(REPO), "nope"]) == 2
    assert "no rule file rules/nope.smk" in capsys.readouterr().err


def test_cli_params_doc_prints_the_parameters_page(capsys):
    assert cli.main(["params-doc"]) == 0
    assert capsys.readouterr().out == (REPO / "docs/parameters.md").read_text()


def test_a_stage_prunes_only_dropped_variants_and_nothing_on_bad_params(tmp_path, capsys, monkeypatch):
    """`encmap stage pip@<model>` (the command DVC runs) validates params before it touches
    anything, then removes the per-encoder files no encoder of params makes."""
    import yaml

    from encmap.params import load_params
    from encmap.workflow.repro import _prune
    from encmap.workflow.stages import stage_job

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    folder = tmp_path / "results/pip/tfidf-svd"
    folder.mkdir(parents=True)
    for name in ("tfidf-svd__d128.h5", "tfidf-svd__d512.h5", "tfidf-svd__d64.h5"):  # d64: a dropped variant
        (folder / name).write_bytes(b"x")
    bad = params | {"qre": {"direction": "forward", "eps": 1.5}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/params.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["--params", "bad/params.yaml", "stage", "pip@tfidf-svd"]) == 2
    assert "key qre.eps" in capsys.readouterr().err and len(list(folder.iterdir())) == 3  # nothing touched
    assert cli.main(["stage", "pip@nope"]) == 2
    assert "stage 'pip@nope': no model 'nope' in params.yaml" in capsys.readouterr().err
    monkeypatch.delenv("DVC_STAGE", raising=False)
    assert cli.main(["stage"]) == 2
    assert "name a stage" in capsys.readouterr().err
    said = []
    _prune(tmp_path, load_params(tmp_path / "params.yaml"), stage_job("pip@tfidf-svd", load_params("params.yaml")),
           None, said.append)
    assert said == [f"removed {folder / 'tfidf-svd__d64.h5'} (no encoder of params makes it)"]
    assert sorted(p.name for p in folder.iterdir()) == ["tfidf-svd__d128.h5", "tfidf-svd__d512.h5"]


def test_catalogue_refuses_counts_and_patterns_that_are_not(capsys):
    """Old: --limit -5 gave all but the last 5 models, --max-params nan was taken (and changed what
    was counted), --name '([' ended in a re.error traceback."""

    for args, match in ((["--limit", "-5"], "argument --limit: '-5': give a count of at least 1"),
                        (["--limit", "0"], "give a count of at least 1"),
                        (["--max-params", "nan"], "argument --max-params: 'nan': a parameter count is a finite number"),
                        (["--min-params", "-1"], "a parameter count is a finite number >= 0")):
        with pytest.raises(SystemExit) as e:
            cli.main(["catalogue", *args])
        assert e.value.code == 2 and match in capsys.readouterr().err, args
    assert cli.main(["catalogue", "--name", "(["]) == 2
    err = capsys.readouterr().err
    assert "--name '([' is not a regular expression" in err and "Traceback" not in err


def test_help_lists_the_everyday_commands_apart_from_the_plumbing_and_the_old_name_still_works(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "SUPPRESS" not in out
    commands, plumbing = out.split("plumbing, the commands dvc.yaml's stages run")
    for everyday in ("check", "encoders", "repro", "place", "regress", "catalogue", "mteb-scores"):
        assert f"\n    {everyday} " in commands, everyday
    for cmd in ("stage", "params-slices"):  # what only dvc.yaml calls
        assert f"\n    {cmd} " not in commands and f"encmap {cmd}" in plumbing, cmd
    for c in cli.COMMANDS:  # every command of the table is listed, or named among the plumbing
        assert f"\n    {c.name} " in commands or f"encmap {c.name}" in plumbing, c.name
    assert "zoo" not in out
    assert cli.main(["zoo", "--name", "(["]) == 2  # the old name runs the catalogue command, and says so
    err = capsys.readouterr().err
    assert "`encmap zoo` is now `encmap catalogue`" in err and "'([' is not a regular expression" in err


def test_catalogue_never_replaces_a_file_that_is_not_a_catalogue(tmp_path, capsys):
    """Old (issue 41): `encmap catalogue --limit 2 --out params.yaml` replaced the whole params file
    with a bare models: block, without a word."""
    params = tmp_path / "params.yaml"
    params.write_text("sentences: {n: 10}\nmodels: {}\nmap: {seed: 0}\n")
    before = params.read_text()
    assert cli.main(["catalogue", "--limit", "2", "--out", str(params)]) == 2
    err = capsys.readouterr().err
    assert "is not a catalogue file (it holds: map, models, sentences)" in err and "--append" in err, err
    assert params.read_text() == before
    assert cli.main(["catalogue", "--limit", "2", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    cat = tmp_path / "catalogue.yaml"  # a catalogue file is replaced as asked
    cat.write_text("models: {}\n")
    assert cli.main(["catalogue", "--limit", "2", "--out", str(cat)]) == 0
    assert len(__import__("yaml").safe_load(cat.read_text())["models"]) == 2
