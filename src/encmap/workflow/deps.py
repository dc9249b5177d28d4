"""What code each workflow stage runs: the files its DVC stage must depend on, no more, no fewer.

A stage's job is declared by ``rules/<stage>.smk`` and runs ``scripts/<stage>.py`` (a ``script:``
rule, or a ``run:`` block that hands the script to :func:`encmap.workflow.jobs.in_process`). Its code
dependencies are those two files, ``scripts/_job.py`` (the helper every script imports, with
everything it imports), and every encmap module the job can execute, found by following imports
from the rule's ``run:`` block and the script:

- through the *functions that are reached*, not whole modules: importing ``f`` from a module
  executes that module's top level and makes ``f`` reachable; ``f``'s body (its lazy imports and
  the module's own helpers it calls) is followed in turn, and nothing else of the module is;
- a class is followed whole (all its methods); importing a module object (``import encmap.x``,
  ``from encmap import x``) follows all of it;
- every package whose module is executed runs its ``__init__.py`` (kept to a docstring, or for
  ``encmap`` its version and a lazy ``__getattr__`` whose body no job reaches);
- a function that imports modules by name (``importlib.import_module(<expression>)``) must sit in
  a module that declares the package it loads from in a module-level ``LOADS_BY_NAME``; every
  module of that package is reached and the stage depends on the package's directory. An
  undeclared dynamic import is an error, so a dependency can never be missed silently;
- a module that reads files beside it (the map page's JavaScript) names them in a module-level
  ``READS``: they are part of its code wherever the module runs.

The digest is the one answer to "which code changes this result": the pair stages key their
reusable pairs by it too (:func:`code_key`, handed to them by their rules).

DVC does not list these files per stage: its ``code`` stage depends on the code as a whole
(:data:`CODE_ROOTS`) and writes a *code digest* per stage, ``results/code/<stage>.sha256`` (the
SHA-256 of every file above and of ``requirements/lock.txt``), each stage's one code dep: twenty code
deps in each of ~4,400 per-model stages made ``dvc status`` cost ~60 s at 1,101 models; one, ~17 s.

Not followed: ``rules/common.smk`` and the Snakefile, with what they import (``encmap.params``,
the stage registry, the schema). They validate params and name the files before any job starts:
they decide *whether and which* jobs run, never what a job writes, and DVC hashes the params'
values itself. An edit to them (a new parameter's description, a better error message) must not
make every stage of a thousand-model map stale.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..encoders.variants import computed_spec
from ..validation import EncmapError
from .stages import BOOKKEEPING, CODE_STAGE, PARAMS_STAGE, STAGES  # noqa: F401 (re-exported: the bookkeeping names)

#: Workflow files that are code but no stage's dependency (see the module docstring).
NOT_STAGE_CODE = ("Snakefile", "rules/common.smk")
#: The exact library stack: part of every stage's digest (it also pins gensim's Wikipedia sample).
LIBRARY_STACK = "requirements/lock.txt"
#: What the ``code`` stage depends on: every file a digest can hash, whatever a later import adds.
CODE_ROOTS = (LIBRARY_STACK, "rules", "scripts", "src/encmap")
#: Where the ``code`` stage writes the digests.
DIGESTS = "results/code"

#: Each stage's params: :attr:`encmap.workflow.stages.Stage.params` (DVC reads them from the
#: stage's *params slice*, written by the ``params`` stage, not from params.yaml: DVC parses a
#: params file once per stage that lists it, which made `dvc status` of a computed 1,101-model
#: map take over an hour).
STAGE_PARAMS: dict[str, tuple[str, ...]] = {name: st.params for name, st in STAGES.items() if st.params}
SLICES = "results/params"
#: The params stage's code: what decides a slice's content.
SLICER = ("src/encmap/workflow/deps.py", "src/encmap/workflow/stages.py")

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
    reads: tuple[str, ...] = ()  # files beside the module it reads (READS): part of its code


class Reach:
    """Import reachability over the encmap package under ``root/src``."""

    def __init__(self, root: str | Path, src: str | Path | None = None):
        self.root = Path(root)
        self.src = Path(src) if src is not None else self.root / "src"
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
                elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "READS"
                                                          for t in node.targets):
                    v = node.value
                    if not (isinstance(v, ast.Tuple) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                             for e in v.elts)):
                        raise EncmapError(f"{path}: READS must be a tuple of file names (string literals) beside it")
                    mod.reads = tuple(e.value for e in v.elts)
                    missing = [r for r in mod.reads if not (path.parent / r).is_file()]
                    if missing:
                        raise EncmapError(f"{path}: READS names {missing[0]!r}, which is not beside it")
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
                self.files |= {mod.path.parent / r for r in mod.reads}
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


def _remembered(what: str, sources: list[Path], compute) -> list[str]:
    """``compute()`` (a list of str), remembered across processes for the same source tree: the
    import analysis (~0.2 s) ran again in every Snakemake process DVC starts. It depends only on the
    ``.py`` and ``.smk`` files under ``sources`` (paths and bytes, hashed in milliseconds), which key
    it under ``.snakemake/encmap``. A cache that cannot be read or written is computed around."""
    import hashlib
    import json

    from ..io import replace_shared_text
    from ..params import RENDERED

    h = hashlib.sha256()
    for base in sources:
        for f in sorted(p for pattern in ("*.py", "*.smk") for p in base.rglob(pattern) if "__pycache__" not in p.parts):
            h.update(f"{f}\0".encode())
            h.update(f.read_bytes())
    # One file per set of source folders (the installed package, a project's copy), named by their content.
    where = hashlib.sha256("\0".join(map(str, sources)).encode()).hexdigest()[:16]
    cache = RENDERED / f"reach-{where}-{h.hexdigest()[:32]}.json"
    try:
        table = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        table = {}
    if isinstance(table.get(what), list):
        return table[what]
    table[what] = value = compute()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        replace_shared_text(cache, json.dumps(table, sort_keys=True))
        for old in cache.parent.glob(f"reach-{where}-*.json"):  # these folders' answers for other contents
            if old != cache:
                old.unlink(missing_ok=True)
    except OSError:
        pass
    return value


def stage_code(root: str | Path, stage: str) -> list[str]:
    """The code files (relative to ``root``) that DVC stage ``stage`` must depend on, sorted.

    Directories stand for every module of a package that is loaded by name (``LOADS_BY_NAME``).
    """
    root = Path(root).resolve()
    return _remembered(f"stage_code {root} {stage}", [root / "rules", root / "scripts", root / "src" / "encmap"],
                       lambda: _stage_code(root, stage))


def _stage_code(root: Path, stage: str) -> list[str]:
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


def module_files(module: str, symbol: str = _MODULE) -> list[Path]:
    """The files of the installed encmap package that running ``module.symbol`` can execute or read
    (the same analysis as a stage's digest), sorted."""
    import encmap

    src = Path(encmap.__file__).resolve().parent.parent

    def compute() -> list[str]:
        reach = Reach(src, src=src)
        reach.reach(module, symbol)
        return sorted(map(str, reach.files))

    return [Path(f) for f in _remembered(f"module_files {src} {module} {symbol}", [src / "encmap"], compute)]


def code_key(root: str | Path, stage: str) -> str:
    """sha256 of ``stage``'s digest text (:func:`stage_digest`): what keys results a stage reuses
    across runs (pair caches), so that any edit to any file it runs invalidates them."""
    import hashlib

    return hashlib.sha256(stage_digest(root, stage).encode()).hexdigest()


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
    from ..io import atomic_write_text

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
    want = {digest_path(stage): stage_digest(root, stage) for stage in STAGES}
    return [Path(rel).stem for rel in _replace_changed(Path(root), want, dry_run)]


def pipeline_outputs(config: dict) -> dict[str, str]:
    """Every path the pipeline writes under ``config`` (relative to the workflow root) -> the stage
    that writes it: each stage's outputs and what DVC tracks of them (per-model ones for every
    model; per-encoder files by their model's folder), the code digests and the params slices."""
    out = {digest_path(s): CODE_STAGE for s in STAGES} | {SLICES: PARAMS_STAGE}
    models = sorted(config["models"])
    for st in STAGES.values():
        for path in [t.path for t in st.tracks] + [p for p in st.outputs(config).values() if "{encoder}" not in p]:
            path = path.replace("{set}", str(config["sentences"]["set"]))
            for m in models if "{model}" in path else [None]:
                out.setdefault(path.replace("{model}", m) if m else path, st.name)
    return out


def check_outside_outputs(folder: str | Path, root: str | Path, config: dict) -> None:
    """Refuse, naming the output and its stage, a folder to write into that is a pipeline output
    (:func:`pipeline_outputs`), lies inside one, or holds one directly: files written there would
    replace the pipeline's (``results/map/map.html``) or sit among them, where DVC and the next run
    take them for its own. Symlinks are followed. Nothing is written before the refusal."""
    from ..validation import EncmapError

    target, root = Path(folder).resolve(), Path(root).resolve()
    for rel, stage in pipeline_outputs(config).items():
        p = root / rel
        where = ("is" if target == p else "lies inside" if p in target.parents else
                 "holds" if target == p.parent else None)
        if where:
            raise EncmapError(f"{folder}: {where} the pipeline's output {rel} (stage {stage!r}); files written there "
                              "would replace its files or sit among them. Nothing was written: name a folder of its own")
    if target.exists() and not target.is_dir():
        raise EncmapError(f"{folder}: a file, not a folder; nothing was written. Name a folder")


def per_model(stage: str) -> bool:
    """Whether ``stage``'s params slice is per model (its params name ``{model}``)."""
    return any("{model}" in k for k in STAGE_PARAMS.get(stage, ()))


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
                if model and key == f"models.{model}":  # an API model's endpoint, key variable, pacing
                    value = computed_spec(value)
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


def generated_dvc_yaml(root: str | Path) -> str:
    """``dvc.yaml`` as the registry and ``root/params.yaml`` make it (:func:`dvc_yaml`)."""
    import yaml

    config = yaml.safe_load((Path(root) / "params.yaml").read_text(encoding="utf-8"))
    return dvc_yaml(config, CODE_ROOTS, SLICER)


def check_dvc_yaml(root: str | Path) -> list[str]:
    """Every way ``root/dvc.yaml`` differs from what the registry generates, and every stage whose
    code cannot be found (:func:`stage_code` raises on an undeclared dynamic import).

    Returns
    -------
    list of str
        One line per problem (empty when dvc.yaml is exact).
    """
    import difflib

    for stage in STAGES:
        stage_code(root, stage)
    p = Path(root) / "dvc.yaml"
    have = p.read_text(encoding="utf-8") if p.is_file() else ""
    want = generated_dvc_yaml(root)
    if have == want:
        return []
    diff = list(difflib.unified_diff(have.splitlines(), want.splitlines(), "dvc.yaml", "generated", lineterm="", n=0))
    return [f"dvc.yaml is not what the stage registry generates (`encmap deps --write`): {len(diff)} lines differ",
            *diff[:40]]


def write_dvc_yaml(root: str | Path) -> bool:
    """Write ``root/dvc.yaml`` as the registry generates it; whether it changed."""
    from ..io import atomic_write_text

    p = Path(root) / "dvc.yaml"
    text = generated_dvc_yaml(root)
    if p.is_file() and p.read_text(encoding="utf-8") == text:
        return False
    atomic_write_text(p, text)
    return True


# ---------------------------------------------------------------------------------- dvc.yaml

_HEADER = """\
# GENERATED from the stage registry (src/encmap/workflow/stages.py) and params.yaml by
# `encmap deps --write`; do not edit by hand (tests/test_deps.py fails when it differs).
#
# DVC decides what is stale (per model); Snakemake executes. Every stage's command is `encmap
# stage`: it reads which stage it is from DVC_STAGE (set by DVC; `embed@<model>` for a per-model
# stage), validates params.yaml and runs that stage's Snakemake targets with --force (DVC has
# decided they must run), --allowed-rules its rule (so Snakemake never runs another stage's job),
# --rerun-incomplete (a killed run never blocks the next) and --nolock (DVC already locks what each
# stage writes; Snakemake's own directory lock would survive a killed run). DVC interpolates no
# value into any command: a params value never reaches a shell. pip and features are one Snakemake
# job per encoder, run in parallel or sent to SLURM (SNAKEMAKE_PROFILE=profiles/slurm dvc repro); the
# per-encoder directories they fill are pruned of dropped variants first.
# Every output persists: DVC never deletes one before its stage runs, Snakemake keeps them while a
# job runs (every rule's outputs are update()) and puts them back if it fails, and each step
# replaces its outputs atomically: a stage that fails or is interrupted leaves the previous
# results in place (docs/pipeline.md).
#
# deps: every file whose change can change a stage's outputs, and no other: its data, the files
# params name (curate's sources, regress's score tables and MTEB results: `encmap deps --write`
# after changing them), and its code digest `results/code/<stage>.sha256`, written by the `code`
# stage: the SHA-256 of every file its rule and script run and of the exact library stack
# (requirements/lock.txt). params: each stage's slice `results/params/<stage>.json` (per model for
# embed and evaluate), written by the `params` stage from params.yaml, which it tracks whole (so
# `dvc params diff` and `dvc exp run -S` work as ever): DVC parses a params file once per stage
# that lists it, which made `dvc status` of a 1,101-model map take over an hour.
"""


def _dvc_path(path: str, per_model: bool) -> str:
    return path.replace("{set}", "${sentences.set}").replace("{model}", "${key}" if per_model else "{model}")


def dvc_yaml(config: dict, code_roots: tuple[str, ...], slicer: tuple[str, ...]) -> str:
    """The whole text of ``dvc.yaml`` for the registry and ``config`` (params.yaml).

    ``code_roots``: what the ``code`` stage depends on; ``slicer``: the ``params`` stage's code.
    """
    out = [_HEADER, "stages:\n", "  code:\n", "    cmd: encmap deps --digest\n", "    deps:\n"]
    out += [f"      - {p}\n" for p in code_roots]
    out += ["    outs:\n"] + [f"      - {digest_path(s)}\n" for s in STAGES] + ["\n"]
    out += ["  params:\n", "    cmd: encmap params-slices\n", "    deps:\n"] + [f"      - {p}\n" for p in slicer]
    out += [
            "    params:\n", "      - params.yaml:\n", "    outs:\n", "      - results/params:\n",
            "          persist: true\n"]
    for st in STAGES.values():
        ind = "      " if st.per_model else "    "
        out += ["\n", f"  # {st.doc}\n", f"  {st.name}:\n"]
        if st.per_model:
            out += ["    foreach: ${models}\n", "    do:\n"]
        out += [f"{ind}cmd: encmap stage\n", f"{ind}deps:\n"]
        deps = [_dvc_path(d, st.per_model) for d in st.deps] + list(st.sources(config)) + [digest_path(st.name)]
        deps += [slice_path(st.name)] if st.params else []
        out += [f"{ind}  - {d}\n" for d in dict.fromkeys(deps)]
        for kind in ("outs", "metrics", "plots"):
            tracks = [t for t in st.tracks if t.kind == kind]
            if tracks:
                out.append(f"{ind}{kind}:\n")
            for t in tracks:
                out.append(f"{ind}  - {_dvc_path(t.path, st.per_model)}:\n")
                out += [f"{ind}      {k}: {v}\n" for k, v in (t.plot or {}).items()]
                out += [f"{ind}      cache: false\n"] if not t.cache else []
                out.append(f"{ind}      persist: true\n")
    return "".join(out)
