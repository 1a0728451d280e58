"""The architecture of ARCHITECTURE.md §1, enforced: layers, independent roles, no import cycles.

The contracts live in pyproject.toml ([tool.importlinter]); `lint-imports` checks them on the
real import graph, imports inside functions included. A backwards import, a role importing
another role, or a cycle between two modules fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def _lint(cwd: Path, *args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([*LINT, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_import_contracts_hold():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_a_cycle_hidden_inside_a_function_still_breaks_the_contract(tmp_path):
    """The cycle contract sees imports placed inside functions, so they cannot hide a cycle."""
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic import b\n")
    (pkg / "b.py").write_text(textwrap.dedent("""
        def late():
            from cyclic import a  # the import a reviewer might not see
            return a
    """))
    (tmp_path / ".importlinter").write_text(textwrap.dedent("""
        [importlinter]
        root_packages =
            cyclic

        [importlinter:contract:acyclic]
        name = no cycles
        type = acyclic_siblings
        ancestors =
            cyclic
    """))
    out = _lint(tmp_path, "--config", str(tmp_path / ".importlinter"), pythonpath=tmp_path)
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout[-2000:]


def test_code_points_to_documents_that_are_in_the_repository():
    """Docstrings and comments cite ARCHITECTURE.md or the paper, not files or issues elsewhere."""
    out = subprocess.run(["git", "grep", "-n", "-I", "-E", r"DESIGN\.md|[Ii]ssue [0-9]", "--", "*.py", "*.proto",
                          "*.sh", "*.toml", "Makefile", ":!tests/test_architecture.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and not out.stdout, out.stdout  # git grep exits 1 when nothing matches


def test_the_consensus_contract_forbids_every_application_module():
    """Consensus may import only itself, the ABCI interface and the base: every other module of
    verifier/ is in the contract's list, so a new application module cannot slip past it."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("source_modules") == ["verifier.consensus"]]
    forbidden = set(contract["forbidden_modules"])
    allowed = {"verifier", "verifier.consensus", "verifier.abci", "verifier.abci.interface"}
    for path in sorted((ROOT / "verifier").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module in allowed or module.startswith("verifier.consensus."):
            continue
        assert any(module == f or module.startswith(f + ".") for f in forbidden), module
