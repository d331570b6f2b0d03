"""The suite runs wherever the README's test command runs: in a user's virtual environment as well as
with the system interpreter. These checks fail loudly when a test reaches for packages installed into
the system (base) interpreter instead of the environment running the tests."""

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BARE_PYTHONS = {"python", "python3", f"python3.{sys.version_info.minor}"}


def sources() -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(TESTS.glob("*.py"))]


def offences(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:  # venv.EnvBuilder(system_site_packages=True): the BASE interpreter's
                if kw.arg == "system_site_packages" and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
                    found.append((node.lineno, "a venv with system_site_packages (the base interpreter's packages)"))
        # ["python3", "-m", ...]: whatever is on PATH ("filetypes": ["python"] is not a command)
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= 2:
            first, second = node.elts[:2]
            flag = isinstance(second, ast.Constant) and isinstance(second.value, str) and second.value.startswith("-")
            if flag and isinstance(first, ast.Constant) and first.value in BARE_PYTHONS:
                found.append((node.lineno, f"runs {first.value!r} from PATH instead of sys.executable"))
    return found


def test_no_test_depends_on_the_system_interpreter():
    bad = [f"{path.name}:{line}: {why}" for path, tree in sources() for line, why in offences(tree)]
    assert not bad, "tests must use the running environment (sys.executable):\n" + "\n".join(bad)


def test_the_check_finds_what_it_looks_for():
    code = ("import venv, subprocess\nvenv.EnvBuilder(system_site_packages=True)\n"
            "subprocess.run(['python3', '-c', 'pass'])\nvenv.EnvBuilder(system_site_packages=False)\n")
    assert [line for line, _ in offences(ast.parse(code))] == [2, 3]
