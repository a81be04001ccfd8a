"""The house plan holds: small serving modules, a short sampler loop, product text without history.

The import rules (the engine imports no web framework, nothing imports the tasks, no circles)
are lint-imports contracts in pyproject.toml, run by scripts/test.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVING_PACKAGES = ("stencil", "drafting", "audit", "gpu_worker")
MAX_MODULE_LINES = 600
MAX_LOOP_LINES = 80
# Work history belongs in our notes, never in product text (CHANGELOG.md speaks of versions).
HISTORY = re.compile(r"session [0-9]|phase-?[0-9]+ (denoiser|recipe)", re.IGNORECASE)


def _tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def test_no_serving_module_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for package in SERVING_PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "migrations" not in path.parts
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_sampler_loop_reads_in_one_sitting() -> None:
    package = REPO / "gpu_worker" / "engine" / "sampler"
    sources = [package / "__init__.py", *package.glob("*.py")] if package.is_dir() else [
        package.with_suffix(".py")
    ]
    lengths = {
        node.name: (node.end_lineno or node.lineno) - node.lineno + 1
        for path in sources
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "denoise_batch"
    }
    assert lengths, "denoise_batch not found in the sampler"
    assert max(lengths.values()) < MAX_LOOP_LINES, lengths


def test_product_text_holds_no_work_history() -> None:
    hits = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # weights, images
        hits += [
            f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}"
            for n, line in enumerate(text.splitlines(), 1)
            if HISTORY.search(line)
        ]
    assert hits == []
