"""The prompt's prefix cut: whatever line the cursor is on, the prompt keeps the lines nearest it
(never an empty prefix when there is text above), and the cut stays put while the user types (the
KV-cache prefix survives). Every entry builds its prompt through build_prompt: the daemon's complete
(LSP, socket, HTTP all map to it: handlers.build_completion), `completiond complete` and the bench."""

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import tiny
from completiond.core.prompt import MIN_KEEP, _stable_cut, build_prompt, line_index
from completiond.service.handlers import QUICK_PROMPT_TOKENS

SRC = (tiny.STDLIB / "textwrap.py").read_text().split("\n")
TEXT = "\n".join((SRC * 3)[:1000]) + "\n"  # 1,000 lines of real code
STARTS = line_index(TEXT)


def line_offsets(text: str) -> list[int]:
    return [0] + [i + 1 for i, c in enumerate(text) if c == "\n"][:-1]


@pytest.mark.parametrize("budget", [QUICK_PROMPT_TOKENS, 1024, 3072])
def test_prefix_keeps_the_lines_above_the_cursor_on_every_line(budget):
    tok = tiny.qwen_tokenizer()
    empties, short = [], []
    for line, start in enumerate(line_offsets(TEXT)):
        # the cursor at the start of the line (the case that lost everything) and at its end
        for offset in {start, TEXT.index("\n", start)}:
            p = build_prompt(tok, TEXT, offset, max_tokens=budget, starts=STARTS)
            assert TEXT[:offset].endswith(p.prefix)
            if offset and not p.prefix.strip():
                empties.append(line)
            if offset > 4 * budget and len(p.ids) < 0.4 * budget:  # text enough above: the budget is used
                short.append((line, len(p.ids)))
    assert not empties, f"empty prefix at lines {empties[:10]}"
    assert not short, f"(line, prompt tokens) where the prefix lost the lines above: {short[:10]}"


def test_quick_prompt_prefix_is_near_its_budget_on_lines_64k():
    """The issue's case: the quick prompt (256 tokens) at lines 64, 128, ... kept nothing above."""
    tok = tiny.qwen_tokenizer()
    for line in range(64, 1000, 64):
        offset = int(STARTS[line])
        p = build_prompt(tok, TEXT, offset, max_tokens=QUICK_PROMPT_TOKENS, starts=STARTS)
        n_prefix = len(tok.encode(p.prefix, add_special_tokens=False))
        assert n_prefix >= QUICK_PROMPT_TOKENS // 4, (line, n_prefix)


def test_cut_keeps_at_least_min_keep_of_the_budget_and_never_more():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        offset = int(rng.integers(1, len(TEXT)))
        budget = int(rng.integers(1, 12000))
        cut = _stable_cut(TEXT, offset, STARTS, budget)
        assert TEXT[:offset].endswith(cut) and len(cut) <= budget
        line_start = TEXT.rfind("\n", 0, offset) + 1
        if offset - line_start <= budget:  # the cursor's line fits: the cut falls on a line start
            assert offset - len(cut) in set(STARTS.tolist())
            # the most whole lines within the budget; a coarse (stable) cut keeps at least MIN_KEEP of it
            nearest = offset - int(STARTS[np.searchsorted(STARTS, offset - budget, side="left")])
            assert len(cut) >= min(nearest, MIN_KEEP * budget), (offset, budget, len(cut), nearest)


def test_cut_stays_put_while_typing():
    """Typing at the end of a line: the prompt's first tokens do not move for most keystrokes."""
    tok = tiny.qwen_tokenizer()
    for budget in (QUICK_PROMPT_TOKENS, 3072):
        line = 700
        text, offset = TEXT, int(STARTS[line + 1]) - 1
        firsts = []
        for k in range(40):
            text = text[:offset] + "x" + text[offset:]
            offset += 1
            p = build_prompt(tok, text, offset, max_tokens=budget)
            firsts.append(tuple(p.ids[:16]))
        assert len(set(firsts)) <= 3, (budget, len(set(firsts)))


def test_every_entry_builds_completion_prompts_through_build_prompt():
    """LSP and HTTP requests become the daemon's `complete` (lsp forwards it; http.py's bridge sends
    it on a synthetic session); its prompt, quick lane included, comes from build_prompt."""
    from completiond.service import handlers, http
    from completiond.bench import modes
    from completiond import cli

    lsp_server = Path(__file__).parents[1] / "lsp" / "completiond_lsp" / "server.py"
    assert 'daemon_request(ls, "complete"' in lsp_server.read_text()  # the LSP server asks the daemon
    src = inspect.getsource(handlers.build_completion)
    assert src.count("build_prompt(") == 2  # the full prompt and the quick one
    assert '"complete"' in inspect.getsource(http)
    for mod in (modes, cli):
        assert "build_prompt(" in inspect.getsource(mod)
    tree = ast.parse(Path(inspect.getfile(handlers)).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "_stable_cut"]
