"""benchmarks/ is a shelf of tools and benchmarks/results holds what the README and docs cite.

- every file under benchmarks/results is a JSON or PNG that README.md or a docs/*.md file cites by its
  path (`benchmarks/results/...`; `{a,b}` alternatives and `*` wildcards count, so a JSON and the plots
  beside it can be cited at once); no code, patches or notes there;
- every citation names at least one file that exists (no dangling paths);
- at most MAX_TOOLS scripts at the top of benchmarks/ (the rest live in benchmarks/experiments);
- no script in benchmarks/ edits sys.path: they run as `python -m benchmarks.X` and import the
  installed package (benchmarks/fuzz.py is exempt until its owner moves it over).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
MAX_TOOLS = 12
SCRIPT_SUFFIXES = {".py", ".sh", ".c"}
SYS_PATH_EXEMPT = {"fuzz.py"}
CITATION = re.compile(r"benchmarks/results/(?:[^\s`'\"()<>\[\]|,;{}]|\{[^{}\s]*\})*")


def doc_texts() -> dict[str, str]:
    docs = {"README.md": (ROOT / "README.md").read_text()}
    docs.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    return docs


def expand(pattern: str) -> list[str]:
    """`a{b,c}d` -> [abd, acd], nested and repeated groups included."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand(pattern[:m.start()] + alt + pattern[m.end():])]


def citations() -> dict[str, list[str]]:
    """Each citation as written (trailing punctuation dropped) -> the docs citing it."""
    out: dict[str, list[str]] = {}
    for name, text in doc_texts().items():
        for raw in CITATION.findall(text):
            out.setdefault(raw.rstrip(".:"), []).append(name)
    return out


def patterns() -> list[str]:
    return [p for raw in citations() for p in expand(raw)]


def result_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*") if p.is_file())


def cited_by(path: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def test_results_hold_only_json_and_png():
    other = [f for f in result_files() if not f.endswith((".json", ".png"))]
    assert not other, f"benchmarks/results holds only cited JSON and PNG files; move or delete: {other}"


def test_every_result_file_is_cited():
    cited = patterns()
    uncited = [f for f in result_files() if not cited_by(f, cited)]
    assert not uncited, (f"{len(uncited)} result files are cited by neither README.md nor docs/*.md "
                         f"(cite them or delete them; git keeps them): {uncited[:20]}")


def test_every_citation_names_a_file():
    """A citation (with its `{a,b}` alternatives: one of them may name a plot that run did not draw)
    names at least one file that exists."""
    files = result_files()
    dangling = {raw: by for raw, by in citations().items()
                if not any(fnmatch.fnmatchcase(f, p) for p in expand(raw) for f in files)}
    assert not dangling, f"cited results that do not exist: {dangling}"


def test_benchmarks_is_a_shelf_of_at_most_12_tools():
    tools = sorted(p.name for p in BENCH.iterdir()
                   if p.is_file() and p.suffix in SCRIPT_SUFFIXES and p.name != "__init__.py")
    assert tools, "no tools found in benchmarks/"
    assert len(tools) <= MAX_TOOLS, f"{len(tools)} scripts at the top of benchmarks/ (at most {MAX_TOOLS}): {tools}"


def test_no_sys_path_edits_in_benchmarks():
    edit = re.compile(r"sys\.path\s*(?:\.\s*(?:insert|append|extend)\s*\(|\[[^\]]*\]\s*=|\+=|=)")
    offenders = [str(p.relative_to(ROOT)) for p in BENCH.rglob("*.py")
                 if p.name not in SYS_PATH_EXEMPT and edit.search(p.read_text())]
    assert not offenders, f"benchmarks edit sys.path (run them as `python -m benchmarks.X`): {offenders}"


def test_the_rules_catch_what_they_are_for():
    """The matching itself: brace expansion, wildcards, and the sys.path pattern."""
    assert expand("a/{x,y}-{1,2}.json") == ["a/x-1.json", "a/x-2.json", "a/y-1.json", "a/y-2.json"]
    assert cited_by("benchmarks/results/p/t-a.png", ["benchmarks/results/p/t-*.png"])
    assert not cited_by("benchmarks/results/p/u.json", ["benchmarks/results/p/t-*"])
    assert CITATION.findall("see `benchmarks/results/zmm/{a,b}.json`, and") == ["benchmarks/results/zmm/{a,b}.json"]
    edit = re.compile(r"sys\.path\s*(?:\.\s*(?:insert|append|extend)\s*\(|\[[^\]]*\]\s*=|\+=|=)")
    assert edit.search("sys.path.insert(0, str(ROOT))") and edit.search("sys.path[:0] = [x]")
    assert not edit.search("print(sys.path)")
