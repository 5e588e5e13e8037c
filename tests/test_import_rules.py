"""Which way the imports run (shared STYLE.md): model_repository -> flint_backend (serving, openai)
-> engine -> model (model.py, ops.py, the KV-cache and step-batch types) -> flint_kernels, and
weights -> config.py; never the other way. Every module's imports are read with `ast`, those
inside functions (and under TYPE_CHECKING) included, so a rule cannot be dodged by a late import."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flint_backend", "flint_kernels")
MODEL_SIDE = ("flint_backend.model", "flint_backend.ops", "flint_backend.kv_cache", "flint_backend.step_batch")


@dataclass(frozen=True)
class Import:
    path: str    # relative to the project root
    line: int
    module: str  # the importing module, dotted
    target: str  # the imported module (or module.name: `from a import b` may import the submodule a.b)


@dataclass(frozen=True)
class Rule:
    name: str
    sources: tuple[str, ...]    # modules (and their submodules) the rule applies to
    forbidden: tuple[str, ...]  # modules (and their submodules) they must not import
    allowed: tuple[str, ...] = ()  # exceptions inside `forbidden`

    def applies_to(self, module: str) -> bool:
        return _within(module, self.sources)

    def breaks(self, target: str) -> bool:
        return _within(target, self.forbidden) and not _within(target, self.allowed)


RULES = [
    Rule("the model side (model, ops, KV-cache and step-batch types) knows no engine, serving or OpenAI server",
         MODEL_SIDE, ("flint_backend.engine", "flint_backend.serving", "flint_backend.openai")),
    Rule("the engine reaches kernels only through the op table", ("flint_backend.engine",), ("flint_kernels",)),
    Rule("the engine knows no Triton server, serving layer or OpenAI server", ("flint_backend.engine",),
         ("flint_backend.serving", "flint_backend.openai", "model_repository", "triton_python_backend_utils",
          "tritonclient")),
    Rule("the OpenAI server talks to Triton, not to the engine or the serving layer", ("flint_backend.openai",),
         ("flint_backend.engine", "flint_backend.serving", "flint_backend.model", "flint_backend.ops",
          "flint_kernels")),
    Rule("weights know config.py only: no kernels, model or engine", ("flint_backend.weights",),
         ("flint_kernels", "flint_backend"), allowed=("flint_backend.config", "flint_backend.weights")),
    Rule("kernels know nothing of flint_backend", ("flint_kernels",), ("flint_backend",)),
    Rule("chat knows no GPU and no engine", ("flint_backend.chat",),
         ("torch", "triton", "flint_kernels", "flint_backend.engine", "flint_backend.model", "flint_backend.ops")),
    Rule("the package serves Flint without transformers' model classes, the oracle it is judged by",
         ("flint_backend", "flint_kernels"), ("transformers.models.flint",)),
]


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[Import]:
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = str(path.relative_to(ROOT))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, module, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append(Import(rel, node.lineno, module, base))
            found += [Import(rel, node.lineno, module, f"{base}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            found.append(Import(rel, node.lineno, module, str(node.args[0].value)))
    return found


def all_imports() -> list[Import]:
    return [i for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")) for i in imports_of(path)]


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_imports_run_one_way(rule, imports):
    broken: dict[tuple[str, int], str] = {}  # one line per import statement, its most specific target
    for i in imports:
        if rule.applies_to(i.module) and rule.breaks(i.target):
            key = (i.path, i.line)
            broken[key] = max(broken.get(key, ""), i.target, key=len)
    lines = [f"{path}:{line}: imports {target}" for (path, line), target in sorted(broken.items())]
    assert not lines, f"{rule.name}:\n  " + "\n  ".join(lines)


def test_every_rule_applies_to_modules_that_exist(imports):
    modules = {i.module for i in imports} | {module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    for rule in RULES:
        assert any(rule.applies_to(m) for m in modules), f"{rule.name}: no module matches {rule.sources}"


def test_the_reader_sees_function_level_and_relative_imports(imports):
    targets = {(i.module, i.target) for i in imports}
    # ops.py imports the attention kernels inside functions; kernels import each other relatively
    assert ("flint_backend.ops", "flint_kernels.decode_attention") in targets
    assert ("flint_kernels.moe_grouped", "flint_kernels.moe_sort") in targets
    assert ("flint_backend.model", "flint_backend.kv_cache") in targets


def test_nothing_registers_a_model_class_with_transformers():
    """AutoModelForCausalLM builds transformers' own FlintForCausalLM from our checkpoints: no
    module may put another class in its place."""
    found = [str(path.relative_to(ROOT)) for pkg in PACKAGES for path in (ROOT / pkg).rglob("*.py")
             if re.search(r"Auto\w+\.register\(", path.read_text())]
    assert found == []
