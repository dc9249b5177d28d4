"""What code each workflow stage runs: the files its DVC stage must depend on, no more, no fewer.

A stage's job is declared by ``rules/<stage>.smk`` and runs ``scripts/<stage>.py`` (a ``script:``
rule, or a ``run:`` block that hands the script to :func:`encmap.jobs.in_process`). Its code
dependencies are those two files, ``scripts/_job.py`` (the helper every script imports, with
everything it imports), and every encmap module the job can execute, found by following imports
from the rule's ``run:`` block and the script:

- through the *functions that are reached*, not whole modules: importing ``f`` from a module
  executes that module's top level and makes ``f`` reachable; ``f``'s body (its lazy imports and
  the module's own helpers it calls) is followed in turn, and nothing else of the module is;
- a class is followed whole (all its methods); importing a module object (``import encmap.x``,
  ``from encmap import x``) follows all of it;
- every package whose module is executed runs its ``__init__.py`` (kept docstring-only);
- a function that imports modules by name (``importlib.import_module(<expression>)``) must sit in
  a module that declares the package it loads from in a module-level ``LOADS_BY_NAME``; every
  module of that package is reached and the stage depends on the package's directory. An
  undeclared dynamic import is an error, so a dependency can never be missed silently.

DVC does not list these files per stage. ``dvc.yaml``'s ``code`` stage depends on the workflow's code
as a whole (:data:`CODE_ROOTS`) and writes one *code digest* per stage, ``results/code/<stage>.sha256``:
the SHA-256 of every file above and of the library stack (``requirements/lock.txt``); each stage
depends on its digest alone. An edit reruns the ``code`` stage (milliseconds), and only the stages
whose digest changed follow. Twenty code deps in each of ~4,400 per-model stages made ``dvc status``
cost ~60 s at 1,101 models (DVC builds and hashes every dep of every stage); one digest each, ~17 s.

Not followed: ``rules/common.smk`` and the Snakefile, with what they import (``encmap.params``,
``encmap.layout``, the schema). They validate params and name the files before any job starts:
they decide *whether and which* jobs run, never what a job writes, and DVC hashes the params'
values itself. An edit to them (a new parameter's description, a better error message) must not
make every stage of a thousand-model map stale.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from .validation import EncmapError

#: Workflow files that are code but no stage's dependency (see the module docstring).
NOT_STAGE_CODE = ("Snakefile", "rules/common.smk")
#: The exact library stack: part of every stage's digest (it also pins gensim's Wikipedia sample).
LIBRARY_STACK = "requirements/lock.txt"
#: What the ``code`` stage depends on: every file a digest can hash, whatever a later import adds.
CODE_ROOTS = (LIBRARY_STACK, "rules", "scripts", "src/encmap")
#: The DVC stage that writes the digests, and where.
CODE_STAGE = "code"
DIGESTS = "results/code"

#: The params each stage's outputs depend on (dotted paths into params.yaml; ``{model}``: the
#: model of a per-model stage). DVC reads them from the stage's *params slice*, written by the
#: ``params`` stage, not from params.yaml: DVC parses a params file once per stage that lists it
#: (ruamel, ~1-1.5 s for 1,101 models), which made `dvc status` of a computed 1,101-model map take
#: over an hour. A stage whose params name ``{model}`` has one slice per model, the others one slice.
#: A path may leave out keys that change no output (``"embed except on_error"``: whether a failure
#: stops the run); ``models.*.meta`` is every model's meta, by model id.
STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "curate": ("sentences",),
    "embed": ("models.{model} except meta", "embed except on_error", "sentences.n"),
    "pip": ("pip",),
    "features": ("qre",),
    "gather": ("models.*.meta",),
    "pairwise": ("qre.eps", "pairwise"),
    "cka_rbf": ("similarity.subset", "similarity.rbf"),
    "stitch": ("similarity.subset", "similarity.stitch"),
    "map": ("map", "regress.predictor"),
    "tasks": ("sentences.n", "evaluate.tasks", "evaluate.seed", "evaluate.supersense", "evaluate.gloss",
              "evaluate.brown", "evaluate.polarity", "evaluate.data"),
    "evaluate": ("models.{model} except meta", "sentences.n", "embed.degenerate", "evaluate.seed",
                 "evaluate.classification", "evaluate.retrieval_k", "evaluate.device", "evaluate.mteb"),
    "regress": ("regress",),
}
PARAMS_STAGE = "params"
SLICES = "results/params"
SLICER = "src/encmap/deps.py"  # the params stage's code: what decides a slice's content
#: DVC bookkeeping stages: run by DVC itself (no Snakemake job), before the stages that use them.
BOOKKEEPING = (CODE_STAGE, PARAMS_STAGE)

_MODULE = "<module>"  # the symbol standing for a module's top-level code
_SMK_IMPORT = re.compile(r"^\s*(?:from\s+(encmap[\w.]*)\s+import\s+([\w\s,()]+?)|import\s+(encmap[\w.]*))\s*$", re.M)
_SMK_SCRIPT = re.compile(r"(?:\.\./scripts/|SCRIPTS / \")(\w+\.py)")


@dataclass
class _Module:
    """One parsed encmap module: its top-level definitions and what its top-level imports bind."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)
    bindings: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module, symbol or <module>)
    loads_by_name: str | None = None


class Reach:
    """Import reachability over the encmap package under ``root/src``."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.src = self.root / "src"
        self._modules: dict[str, _Module | None] = {}
        self.files: set[Path] = set()
        self.dirs: set[Path] = set()
        self._done: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ modules
    def module(self, name: str) -> _Module | None:
        """The parsed module ``name`` (e.g. ``encmap.io``), or None if it is no encmap module."""
        if name in self._modules:
            return self._modules[name]
        base = self.src / Path(*name.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        mod = None
        if name.split(".")[0] == "encmap" and path.is_file():
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            mod = _Module(name, path, path.name == "__init__.py", tree)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    mod.defs[node.name] = node
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    mod.bindings.update(self._bind(mod, node))
                elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LOADS_BY_NAME"
                                                          for t in node.targets):
                    if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                        raise EncmapError(f"{path}: LOADS_BY_NAME must be a string literal (a package name)")
                    mod.loads_by_name = node.value.value
        self._modules[name] = mod
        return mod

    def _absolute(self, mod: _Module, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
        base = package[:len(package) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _bind(self, mod: _Module, node: ast.Import | ast.ImportFrom) -> dict[str, tuple[str, str]]:
        """Names an import statement binds to encmap modules or symbols."""
        out: dict[str, tuple[str, str]] = {}
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "encmap":
                    # `import encmap.x.y as z` binds z to encmap.x.y; without `as`, it binds `encmap`.
                    out[a.asname or "encmap"] = (a.name if a.asname else "encmap", _MODULE)
            return out
        base = self._absolute(mod, node)
        if base.split(".")[0] != "encmap":
            return out
        for a in node.names:
            sub = f"{base}.{a.name}"
            if self.module(sub) is not None:
                out[a.asname or a.name] = (sub, _MODULE)
            else:
                out[a.asname or a.name] = (base, a.name)
        return out

    # ------------------------------------------------------------------ reaching
    def reach(self, module: str, symbol: str = _MODULE) -> None:
        """Mark ``module.symbol`` as executed and follow everything it can run."""
        todo = [(module, symbol)]
        while todo:
            key = todo.pop()
            if key in self._done:
                continue
            self._done.add(key)
            name, sym = key
            mod = self.module(name)
            if mod is None:
                continue
            if sym == _MODULE:
                self.files.add(mod.path)
                parts = name.split(".")
                todo += [(".".join(parts[:i]), _MODULE) for i in range(1, len(parts))]  # package __init__s
                todo += self._follow(mod, [n for n in mod.tree.body if not isinstance(
                    n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))] + self._def_headers(mod), mod.bindings)
                continue
            todo.append((name, _MODULE))  # importing a symbol runs its module's top level
            if sym in mod.defs:
                node = mod.defs[sym]
                body = node.body if not isinstance(node, ast.ClassDef) else [node]
                todo += self._follow(mod, body, mod.bindings | self._local_bindings(mod, node), where=sym)
            elif sym in mod.bindings:  # a name the module imports itself (a re-export)
                todo.append(mod.bindings[sym])

    @staticmethod
    def _def_headers(mod: _Module) -> list[ast.AST]:
        """Decorators, default values and base classes of top-level defs: they run at import."""
        out: list[ast.AST] = []
        for node in mod.defs.values():
            out += list(node.decorator_list)
            if isinstance(node, ast.ClassDef):
                out += list(node.bases)
            else:
                out += list(node.args.defaults) + [d for d in node.args.kw_defaults if d is not None]
        return out

    def _local_bindings(self, mod: _Module, node: ast.AST) -> dict[str, tuple[str, str]]:
        """Names bound by imports inside a def (lazy imports), anywhere in its body."""
        out: dict[str, tuple[str, str]] = {}
        for n in ast.walk(node):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and n is not node:
                out.update(self._bind(mod, n))
        return out

    def _follow(self, mod: _Module, nodes: list[ast.AST], bindings: dict[str, tuple[str, str]],
                where: str = _MODULE) -> list[tuple[str, str]]:
        """Symbols the given code can run: imports it executes, helpers and imported names it uses."""
        out: list[tuple[str, str]] = []
        for top in nodes:
            for n in ast.walk(top):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    for target in self._bind(mod, n).values():
                        out.append(target)
                        if target[1] != _MODULE:
                            out.append((target[0], _MODULE))
                    if isinstance(n, ast.Import):  # `import encmap.a.b` executes encmap.a.b
                        out += [(a.name, _MODULE) for a in n.names if a.name.split(".")[0] == "encmap"]
                elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
                    if n.id in mod.defs:
                        out.append((mod.name, n.id))
                    elif n.id in bindings:
                        out += self._whole_if_module(bindings[n.id])
                elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in bindings:
                    target = bindings[n.value.id]
                    if target[1] == _MODULE:
                        sub = f"{target[0]}.{n.attr}"
                        out.append((sub, _MODULE) if self.module(sub) is not None else (target[0], n.attr))
                elif isinstance(n, ast.Call) and self._is_dynamic_import(n):
                    out += self._dynamic(mod, where)
        return out

    def _whole_if_module(self, target: tuple[str, str]) -> list[tuple[str, str]]:
        """A module object used other than by attribute: everything in it may run."""
        name, sym = target
        if sym != _MODULE:
            return [target]
        mod = self.module(name)
        return [target] + ([(name, d) for d in mod.defs] if mod else [])

    @staticmethod
    def _is_dynamic_import(call: ast.Call) -> bool:
        f = call.func
        named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or \
            (isinstance(f, ast.Name) and f.id == "import_module")
        return named and not (call.args and isinstance(call.args[0], ast.Constant))

    def _dynamic(self, mod: _Module, where: str) -> list[tuple[str, str]]:
        if mod.loads_by_name is None:
            raise EncmapError(f"{mod.path}: {where} imports modules by name but the module declares no "
                              "LOADS_BY_NAME (the package it loads them from), so the stages that run it "
                              "cannot know their code")
        pkg = self.module(mod.loads_by_name)
        if pkg is None or not pkg.is_package:
            raise EncmapError(f"{mod.path}: LOADS_BY_NAME = {mod.loads_by_name!r} is not an encmap package")
        self.dirs.add(pkg.path.parent)
        out = [(mod.loads_by_name, _MODULE)]
        for f in sorted(pkg.path.parent.glob("*.py")):
            if f.name != "__init__.py":
                sub = f"{mod.loads_by_name}.{f.stem}"
                out += self._whole_if_module((sub, _MODULE))
        return out


def _smk_entries(text: str) -> list[tuple[str, str]]:
    """encmap symbols that a rule file's Python lines import (a ``run:`` block's imports)."""
    out = []
    for m in _SMK_IMPORT.finditer(text):
        if m.group(3):
            out.append((m.group(3), _MODULE))
        else:
            names = [x.strip().split(" as ")[0] for x in m.group(2).replace("(", "").replace(")", "").split(",")]
            out += [(m.group(1), n) for n in names if n]
    return out


def _encmap_imports(tree: ast.AST) -> list[tuple[str, str]]:
    """Every absolute encmap import anywhere in ``tree``, as (module, symbol) entries."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "encmap":
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, _MODULE) for a in node.names if a.name.split(".")[0] == "encmap"]
    return out


def stage_code(root: str | Path, stage: str) -> list[str]:
    """The code files (relative to ``root``) that DVC stage ``stage`` must depend on, sorted.

    Directories stand for every module of a package that is loaded by name (``LOADS_BY_NAME``).
    """
    root = Path(root)
    rule = root / "rules" / f"{stage}.smk"
    if not rule.is_file():
        raise EncmapError(f"stage {stage!r}: no rule file {rule.relative_to(root)} (one rule file per stage)")
    text = rule.read_text(encoding="utf-8")
    reach = Reach(root)
    files = {rule}
    entries = _smk_entries(text)
    scripts = sorted(set(_SMK_SCRIPT.findall(text)))
    if scripts != [f"{stage}.py"]:
        raise EncmapError(f"{rule.relative_to(root)}: runs scripts {scripts}, expected exactly scripts/{stage}.py")
    script = root / "scripts" / scripts[0]
    files.add(script)
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] == "encmap":
                entries += [(node.module, a.name) for a in node.names]
            elif (root / "scripts" / f"{node.module}.py").is_file():
                # A helper beside the scripts (scripts/_job.py): all it imports, lazily or not.
                helper = root / "scripts" / f"{node.module}.py"
                files.add(helper)
                entries += _encmap_imports(ast.parse(helper.read_text(encoding="utf-8"), filename=str(helper)))
        elif isinstance(node, ast.Import):
            entries += [(a.name, _MODULE) for a in node.names if a.name.split(".")[0] == "encmap"]
    for module, symbol in entries:
        reach.reach(module, symbol)
    files |= {f for f in reach.files if not any(d in f.parents for d in reach.dirs)}
    out = sorted(str(f.relative_to(root)) for f in files) + sorted(str(d.relative_to(root)) for d in reach.dirs)
    return sorted(out)


def digest_path(stage: str) -> str:
    """The code digest DVC stage ``stage`` depends on (written by the ``code`` stage)."""
    return f"{DIGESTS}/{stage}.sha256"


def stage_digest(root: str | Path, stage: str) -> str:
    """The text of ``stage``'s code digest: ``<sha256>  <path>`` per file it runs, and the library stack.

    A package loaded by name (a directory in :func:`stage_code`) contributes each of its modules.
    """
    import hashlib

    root = Path(root)
    files: list[str] = [LIBRARY_STACK]
    for entry in stage_code(root, stage):
        path = root / entry
        files += sorted(str(f.relative_to(root)) for f in path.rglob("*.py")
                        if "__pycache__" not in f.parts) if path.is_dir() else [entry]
    lines = [f"# code of stage {stage}: the files its job runs (encmap deps) and the library stack"]
    lines += [f"{hashlib.sha256((root / f).read_bytes()).hexdigest()}  {f}" for f in sorted(set(files))]
    return "\n".join(lines) + "\n"


def _replace_changed(base: Path, want: dict[str, str], dry_run: bool = False) -> list[str]:
    """Write each ``want`` file (path relative to ``base`` -> text) whose text differs, atomically;
    the paths that differed (``dry_run``: only listed, nothing written)."""
    from .io import atomic_write_text

    changed = []
    for rel, text in want.items():
        f = base / rel
        if not f.is_file() or f.read_text(encoding="utf-8") != text:
            changed.append(rel)
            if not dry_run:
                f.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(f, text)
    return changed


def write_digests(root: str | Path, dry_run: bool = False) -> list[str]:
    """Write every stage's code digest under ``root/results/code``; the stages whose digest changed.

    Each file is replaced atomically and only when its text changes (``dry_run``: none is).
    """
    want = {digest_path(stage): stage_digest(root, stage) for stage in dvc_stages(root) if stage not in BOOKKEEPING}
    return [Path(rel).stem for rel in _replace_changed(Path(root), want, dry_run)]


def per_model(stage: str) -> bool:
    """Whether ``stage``'s params slice is per model (its params name ``{model}``)."""
    return any("{model}" in k for k in STAGE_PARAMS[stage])


def slice_path(stage: str, model: str = "${key}") -> str:
    """The params slice a stage depends on (``model``: a per-model stage's model)."""
    return f"{SLICES}/{stage}/{model}.json" if per_model(stage) else f"{SLICES}/{stage}.json"


def param_slices(params: dict) -> dict[str, str]:
    """Every params slice: path (relative to the workflow root) -> JSON text.

    A slice maps each of its stage's param paths to the value at that path (absent paths left
    out); keys sorted, so the bytes change exactly when a value the stage uses changes.
    """
    import json

    def at(path: str):
        node = params
        for k in path.split("."):
            if not isinstance(node, dict) or k not in node:
                raise KeyError(path)
            node = node[k]
        return node

    out = {}
    for stage, paths in STAGE_PARAMS.items():
        for model in sorted(params["models"]) if per_model(stage) else [None]:
            values = {}
            for path in paths:
                key, _, leave_out = path.format(model=model).partition(" except ")
                try:
                    if key.startswith("models.*."):  # one value per model
                        rest = key.split(".", 2)[2]
                        value = {m: at(f"models.{m}.{rest}") for m in sorted(params["models"])}
                    else:
                        value = at(key)
                except KeyError:
                    continue
                if leave_out:
                    value = {k: v for k, v in value.items() if k not in leave_out.split(",")}
                values[key] = value
            out[slice_path(stage, model) if model else slice_path(stage)] = json.dumps(
                values, sort_keys=True, indent=1, default=str) + "\n"
    return out


def write_slices(root: str | Path, params: dict, dry_run: bool = False) -> list[str]:
    """Write every params slice under ``root``; the slices whose text changed.

    Slices no stage uses any more (a model dropped from params) are removed. Each file is
    replaced atomically and only when its text changes (``dry_run``: nothing is written or removed).
    """
    base = Path(root)
    want = param_slices(params)
    changed = _replace_changed(base, want, dry_run)
    for f in sorted((base / SLICES).rglob("*.json")) if (base / SLICES).is_dir() else []:
        if str(f.relative_to(base)) not in want:
            if not dry_run:
                f.unlink()
            changed.append(str(f.relative_to(base)))
    return changed


def is_code(dep: str) -> bool:
    """Whether a dvc.yaml dependency is workflow code (rules, scripts, the sources, the library stack)."""
    return dep.startswith(("rules/", "scripts/", "src/")) or dep in NOT_STAGE_CODE or dep == LIBRARY_STACK


def _stage_entries(root: str | Path) -> dict[str, dict]:
    import yaml

    p = Path(root) / "dvc.yaml"
    return {name: (st.get("do") or st) for name, st in yaml.safe_load(p.read_text(encoding="utf-8"))["stages"].items()}


def _names(items: list) -> list[str]:
    """Paths of a dvc.yaml deps / outs list (an entry is a path or a one-key mapping of options)."""
    return [next(iter(x)) if isinstance(x, dict) else x for x in items]


def dvc_stages(root: str | Path) -> dict[str, list[str]]:
    """Each stage of ``root/dvc.yaml`` with its deps as written (``foreach`` stages by their ``do``)."""
    return {name: _names(st.get("deps", [])) for name, st in _stage_entries(root).items()}


def check_dvc_yaml(root: str | Path) -> list[str]:
    """Every way ``dvc.yaml``'s code and params deps differ from the scheme (module docstring).

    Each stage but the bookkeeping ones depends on its code digest and lists no code file
    itself; a stage of :data:`STAGE_PARAMS` depends on its params slice, and no stage but
    ``params`` lists ``params:``; the ``code`` stage depends on :data:`CODE_ROOTS` and writes
    exactly one digest per stage; the ``params`` stage tracks params.yaml whole and writes the
    slices; every stage's code can be found (:func:`stage_code` raises on an undeclared dynamic
    import).

    Returns
    -------
    list of str
        One line per problem (empty when dvc.yaml is exact).
    """
    entries = _stage_entries(root)
    problems = [f"no stage {s!r} (DVC bookkeeping, {where})" for s, where in (
        (CODE_STAGE, f"writes the code digests {DIGESTS}/<stage>.sha256"),
        (PARAMS_STAGE, f"writes the params slices under {SLICES}")) if s not in entries]
    problems += [f"STAGE_PARAMS names {s!r}, which dvc.yaml lacks" for s in STAGE_PARAMS if s not in entries]
    if problems:
        return problems
    for stage, st in entries.items():
        deps = [d.rstrip("/") for d in _names(st.get("deps", []))]
        if stage == CODE_STAGE:
            outs, want = set(_names(st.get("outs", []))), {
                digest_path(s) for s in entries if s not in BOOKKEEPING}
            problems += [f"stage {stage}: missing output {d}" for d in sorted(want - outs)]
            problems += [f"stage {stage}: extra output {d} (no such stage)" for d in sorted(outs - want)]
            if sorted(deps) != sorted(CODE_ROOTS):
                problems.append(f"stage {stage}: deps {deps}, expected {list(CODE_ROOTS)}")
            continue
        if stage == PARAMS_STAGE:
            if st.get("params") != [{"params.yaml": None}] or _names(st.get("outs", [])) != [SLICES] or \
                    deps != [SLICER]:
                problems.append(f"stage {stage}: expected deps [{SLICER}], params [params.yaml (whole)] and "
                                f"outs [{SLICES}]")
            continue
        stage_code(root, stage)
        problems += [f"stage {stage}: lists code {d} itself (its code is {digest_path(stage)}, which "
                     f"the {CODE_STAGE} stage writes)" for d in deps if is_code(d)]
        if digest_path(stage) not in deps:
            problems.append(f"stage {stage}: missing {digest_path(stage)} (the code it runs)")
        problems += [f"stage {stage}: extra {d} (another stage's code)" for d in deps
                     if d.startswith(f"{DIGESTS}/") and d != digest_path(stage)]
        if "params" in st:
            problems.append(f"stage {stage}: lists params itself (DVC would parse params.yaml for it; its "
                            f"params are {slice_path(stage) if stage in STAGE_PARAMS else 'none'})")
        want = [slice_path(stage)] if stage in STAGE_PARAMS else []
        got = [d for d in deps if d.startswith(f"{SLICES}/")]
        if got != want:
            problems.append(f"stage {stage}: params slice deps {got}, expected {want}")
    return problems


def write_dvc_yaml(root: str | Path) -> bool:
    """Rewrite the code deps of every stage in ``root/dvc.yaml`` to the digest scheme, in place.

    Each stage's code deps become its digest, and its ``params:`` its params slice (both after its
    other deps); the ``code`` stage's deps become :data:`CODE_ROOTS` and its outs one digest per
    stage; the ``params`` stage depends on the code that slices. Comments and everything else are
    kept as written. Returns whether the file changed.
    """
    stages = [s for s in _stage_entries(root) if s not in BOOKKEEPING]
    p = Path(root) / "dvc.yaml"
    lines = p.read_text(encoding="utf-8").splitlines(keepends=True)
    stage_re = re.compile(r"^  ([A-Za-z0-9_-]+):\s*$")
    out: list[str] = []
    stage = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = stage_re.match(line)
        if m:
            stage = m.group(1)
        dm = re.match(r"^(\s+)deps:\s*$", line)
        if dm and stage is not None:
            out.append(line)
            i += 1
            items: list[str] = []
            indent = None
            while i < len(lines) and re.match(r"^\s+- ", lines[i]):
                indent = indent or lines[i][:lines[i].index("-")]
                items.append(lines[i])
                i += 1
            if stage in BOOKKEEPING:
                out += [f"{indent}- {d}\n" for d in (CODE_ROOTS if stage == CODE_STAGE else (SLICER,))]
                continue
            kept = [x for x in items if not is_code(x.strip()[2:].strip().rstrip(":"))
                    and not x.strip()[2:].strip().startswith((f"{DIGESTS}/", f"{SLICES}/"))]
            out += kept + [f"{indent}- {digest_path(stage)}\n"]
            out += [f"{indent}- {slice_path(stage)}\n"] if stage in STAGE_PARAMS else []
            continue
        if re.match(r"^\s+params:\s*$", line) and stage != PARAMS_STAGE:  # DVC reads the slice instead
            i += 1
            while i < len(lines) and re.match(r"^\s+- ", lines[i]):
                i += 1
            continue
        om = re.match(r"^(\s+)outs:\s*$", line)
        if om and stage == CODE_STAGE:
            out.append(line)
            i += 1
            indent = None
            while i < len(lines) and (re.match(r"^\s+- ", lines[i]) or (
                    indent is not None and lines[i].startswith(indent + "  ") and lines[i].strip())):
                indent = indent or lines[i][:lines[i].index("-")]
                i += 1
            indent = indent or line[:len(line) - len(line.lstrip())] + "  "
            out += [f"{indent}- {digest_path(s)}\n" for s in stages]
            continue
        out.append(line)
        i += 1
    text = "".join(out)
    changed = text != p.read_text(encoding="utf-8")
    if changed:
        from .io import atomic_write_text

        atomic_write_text(p, text)
    return changed
