"""Fill-in-the-middle as Qwen2.5-Coder was trained: prompt layout, repository context, stops, end tokens."""

import pytest
import torch

import tiny
from completiond.core.engine import Engine, Request
from completiond.core.prompt import ContextFile, build_prompt, extend_middle, fim_tokens
from completiond.core.prompt.stops import StopRules

TEXT = "import util\n\ndef area(r):\n    return 3.14 * r * r\n\n\ndef main():\n    print(area(2))\n"


def ids(tok, *names):
    return [tok.convert_tokens_to_ids(n) for n in names]


def test_prefix_suffix_middle_with_the_real_suffix():
    tok = tiny.qwen_tokenizer()
    pre, mid, suf = ids(tok, "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")
    at = TEXT.index("3.14")
    p = build_prompt(tok, TEXT, at)
    assert p.ids[0] == pre and p.ids[-1] == mid
    k = p.ids.index(suf)
    assert tok.decode(p.ids[1:k]) + p.heal.text == TEXT[:at]  # the last prefix token is healed
    assert tok.decode(p.ids[k + 1:-1]) == TEXT[at:]


def test_repository_context_in_qwen_format_before_the_file():
    tok = tiny.qwen_tokenizer()
    repo, sep, pre = ids(tok, "<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>")
    other = ContextFile("pkg/util.py", "def helper(x):\n    return x + 1\n")
    at = TEXT.index("print")
    p = build_prompt(tok, TEXT, at, path="pkg/main.py", context=[other], repo="demo")
    head = p.ids[:p.ids.index(pre)]
    assert head[0] == repo and head.count(sep) == 2
    text = tok.decode(head)
    assert text == ("<|repo_name|>demo\n<|file_sep|>pkg/util.py\ndef helper(x):\n    return x + 1\n\n"
                    "<|file_sep|>pkg/main.py\n")
    # typing at the cursor keeps the whole head (and the prefix before the cursor) reusable
    typed = TEXT[:at] + "pr" + TEXT[at:]
    q = build_prompt(tok, typed, at + 2, path="pkg/main.py", context=[other], repo="demo")
    assert q.ids[:len(head) + 5] == p.ids[:len(head) + 5]
    # an empty list: the header alone; no list (serve without --repo-context): plain FIM
    alone = build_prompt(tok, TEXT, at, path="pkg/main.py", context=[], repo="demo")
    assert tok.decode(alone.ids[:alone.ids.index(pre)]) == "<|repo_name|>demo\n<|file_sep|>pkg/main.py\n"
    assert build_prompt(tok, TEXT, at, path="pkg/main.py", repo="demo").ids[0] == pre


def test_context_stays_within_its_budget():
    tok = tiny.qwen_tokenizer()
    big = [ContextFile(f"m{i}.py", "x = 1\n" * 2000) for i in range(5)]
    p = build_prompt(tok, TEXT, 10, path="a.py", context=big, max_tokens=512)
    pre = fim_tokens(tok).prefix
    assert p.ids.index(pre) <= 512 // 4
    assert len(p.ids) <= 512 + 4


def test_a_completion_never_repeats_the_next_line_or_the_rest_of_the_line():
    tok = tiny.qwen_tokenizer()
    at = TEXT.index("\n    return")  # end of the `def area(r):` line
    stops = build_prompt(tok, TEXT, at, multiline=True).stops
    assert stops.next_line == "return 3.14 * r * r"
    text = "\n    r2 = r * r\n    return 3.14 * r * r\n"
    assert text[:stops.cut(text)] == "\n    r2 = r * r"
    assert stops.cut("\n    return 3.14 * r * r\n") == 0  # the next line itself: nothing to add
    mid = TEXT.index("(2)") + 1  # cursor inside "area(|2))"
    s = build_prompt(tok, TEXT, mid, multiline=True).stops
    assert s.line_rest == "2))"
    gen = "radius2))\n    more\n"
    assert gen[:s.cut(gen)] == "radius"


def test_blank_line_in_a_block_completes_the_body_and_stops_at_dedent():
    s = StopRules(multiline=True, cursor_indent=0, line_head="")  # cursor after `if __name__ == ...:` + newline
    text = "    main()\n```\n\nThis code"
    assert text[:s.cut(text)] == "    main()"


def test_several_lines_only_where_the_block_can_grow():
    """Between existing lines of a block a suggestion is one line; at a block's end, after a block
    opener and at the end of the file it may run on (Copilot's rule)."""
    tok = tiny.qwen_tokenizer()
    gen = "x = 1\n    return x\ndef h():\n"
    text = "def f():\n    \n    return 0\n"  # blank line inside a body: code at its indentation follows
    inside = build_prompt(tok, text, text.index("\n    \n") + 5, multiline=True).stops
    assert gen[:inside.cut(gen)] == "x = 1"
    text = "def f():\n    a = 1\n    \n\ndef g():\n    pass\n"  # the body's end: the next code is dedented
    end = build_prompt(tok, text, text.index("\n    \n") + 5, multiline=True).stops
    assert gen[:end.cut(gen)] == "x = 1\n    return x"
    text = "class A:\n    def f(self):\n    def g(self):\n        pass\n"  # an opener with an empty body
    opener = build_prompt(tok, text, text.index(":\n    def g") + 1, multiline=True).stops
    body = "\n        return 1\n    def h(self):\n"
    assert body[:opener.cut(body)] == "\n        return 1"
    text = "x = 1\n"
    assert build_prompt(tok, text, len(text), multiline=True).stops.multiline  # end of the file
    assert not build_prompt(tok, "\n" + text, 0, multiline=True).stops.multiline  # code follows at column 0


def test_fim_end_tokens_end_a_completion():
    lm = tiny.loaded(tiny.qwen2_config(), seed=3)
    eos = lm.eos_ids()
    assert set(ids(lm.tokenizer, "<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>")) <= eos


@pytest.mark.parametrize("mode", ["ar", "pld", "draft", "combined"])
def test_lossless_with_a_tiny_qwen2_and_fim_prompts(mode):
    """Every mode's greedy output equals plain decoding (fp32), on FIM prompts with repo context."""
    target = tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0)
    draft = tiny.loaded(tiny.qwen2_config(layers=1), seed=6, scale=4.0)
    engine = Engine(target, draft, always_speculate=True)
    source = (tiny.STDLIB / "textwrap.py").read_text()[:6000]
    engine.index.set_open("file:///t.py", target.tokenizer.encode(source, add_special_tokens=False))
    healed = 0
    for at in (800, 2500, 4100):
        p = build_prompt(target.tokenizer, source, at, path="t.py", repo="r",
                         context=[ContextFile("u.py", source[:300])], max_tokens=400)
        healed += p.heal is not None  # mid-line cursors: the last prefix token is healed
        ref = engine.complete(Request(prompt=p.ids, mode="ar", max_tokens=24, heal=p.heal))
        got = engine.complete(Request(prompt=p.ids, mode=mode, max_tokens=24, heal=p.heal))
        assert got.token_ids == ref.token_ids
        assert len(ref.token_ids) > 0
    assert healed >= 1


def test_rewrite_uses_the_chat_template_and_keeps_the_selection_in_the_prompt():
    import copy

    from completiond.core.prompt.rewrite import rewrite_prompt

    tok = copy.deepcopy(tiny.qwen_tokenizer())
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    selection = "def f(a):\n    return a\n"
    text = "x = 1\n" + selection
    ids, stops = rewrite_prompt(tok, text, 6, len(text), "Rename `a` to `b`.", "python")
    shown = tok.decode(ids)
    assert shown.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in shown
    assert shown.endswith("<|im_start|>assistant\n```python\n")
    assert selection in shown and "Rename `a` to `b`." in shown
    assert stops.cut("def f(b):\n    return b\n```\n") == len("def f(b):\n    return b")


def test_related_files_open_buffers_first_then_imported_workspace_files(tmp_path):
    from completiond.core.prompt.context import related_files

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "util.py").write_text("def helper():\n    return 1\n")
    (tmp_path / "pkg" / "other.py").write_text("X = 2\n")
    ws = [("pkg/util.py", tmp_path / "pkg" / "util.py"), ("pkg/other.py", tmp_path / "pkg" / "other.py")]
    text = "from pkg.util import helper\nimport json\n\nhelper()\n"
    got = related_files("pkg/main.py", text, [("notes.py", "N = 1\n"), ("pkg/main.py", text)], ws)
    assert [f.path for f in got] == ["notes.py", "pkg/util.py"]
    assert got[1].text.startswith("def helper")


def test_related_files_resolve_relative_imports_and_not_a_stdlib_name_inside_a_package(tmp_path):
    from completiond.core.prompt.context import related_files

    files = {"pkg/__init__.py": "", "pkg/utils.py": "NO_DEFAULT = object()\n",
             "pkg/curried/__init__.py": "", "pkg/curried/operator.py": "from operator import *\n",
             "pkg/sandbox/core.py": "def unzip(seq):\n    pass\n", "src/lib/__init__.py": "", "src/lib/io.py": "R = 1\n"}
    for rel, body in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    ws = [(rel, tmp_path / rel) for rel in files]
    text = "import operator\nfrom distutils.core import setup\nfrom .utils import NO_DEFAULT\nimport lib.io\n"
    got = related_files("pkg/dicttoolz.py", text, [], ws)
    # operator is the standard library's, distutils.core is not pkg/sandbox/core.py; src/ is no package
    assert [f.path for f in got] == ["pkg/utils.py", "src/lib/io.py"]
    got = related_files("pkg/curried/exceptions.py", "from ..utils import NO_DEFAULT\nfrom . import operator\n", [], ws)
    assert [f.path for f in got] == ["pkg/utils.py"]


def test_token_healing_takes_the_split_token_off_and_constrains_the_first_token():
    tok = tiny.qwen_tokenizer()
    text = "def main():\n    pass\n\n\nif __name__ == '__main__':\n    ma\n"
    at = text.index("    ma") + 6
    p = build_prompt(tok, text, at)
    whole = tok.encode(text[:at], add_special_tokens=False)
    assert tok.decode(p.ids).startswith("<|fim_prefix|>" + tok.decode(whole[:-1]) + "<|fim_suffix|>")
    assert p.heal.text == tok.decode(whole[-1:]) and "ma".endswith(p.heal.text)  # the tiny BPE splits "m", "a"
    assert whole[-1] in p.heal.allowed
    assert all(tok.decode([i]).startswith(p.heal.text) for i in p.heal.allowed)
    assert build_prompt(tok, text, text.index("\n\n\nif") + 1).heal is None


def test_healed_completion_hides_the_text_the_editor_shows():
    target = tiny.loaded(tiny.qwen2_config(), seed=7, scale=4.0)
    tok = target.tokenizer
    text = "def main():\n    pass\n\n\nif __name__ == '__main__':\n    ma\n"
    at = text.index("    ma") + 6
    p = build_prompt(tok, text, at, multiline=True)
    res = Engine(target).complete(Request(prompt=p.ids, mode="ar", max_tokens=6, stops=p.stops, heal=p.heal))
    assert res.token_ids and res.token_ids[0] in p.heal.allowed
    full = tok.decode(res.token_ids)
    assert full.startswith(p.heal.text)
    cut = p.stops.cut(full[len(p.heal.text):])
    assert res.text == full[len(p.heal.text):][:cut]


def test_after_indentation_the_prompt_stops_one_blank_short():
    """A cursor after a line's indentation: byte-level BPE writes "    x" as "   " + " x", so the
    prompt leaves out the indentation's last blank and the first token must be that blank followed
    by code (hidden: the editor shows it); end tokens stay allowed."""
    tok = tiny.qwen_tokenizer()
    text = "def f():\n    x = 1\n    \n\t\tpass\n"
    at = text.index("    \n") + 4
    p = build_prompt(tok, text, at)
    assert p.heal.text == " "
    assert tok.decode(p.ids).startswith("<|fim_prefix|>" + text[:at - 1] + "<|fim_suffix|>")
    firsts = [tok.decode([i]) for i in p.heal.allowed if i not in tok.added_tokens_decoder]
    assert firsts and all(t[:1] == " " and t[1:2] not in ("", " ", "\t", "\n") for t in firsts)
    assert tok.encode("    return", add_special_tokens=False)[-1] in p.heal.allowed  # " return" of "   " + " return"
    assert tok.convert_tokens_to_ids("<|endoftext|>") in p.heal.allowed  # it may still end at once
    tab = build_prompt(tok, text, text.index("\tpass") + 1)
    assert tab.heal.text == "\t" and tok.decode(tab.ids).startswith("<|fim_prefix|>" + text[:text.index("\tpass")]
                                                                     + "<|fim_suffix|>")
    assert build_prompt(tok, text, text.index("= 1") + 2).heal.text == " "  # after "= ": the " " token healed
    assert build_prompt(tok, text, text.index("\n    x") + 1).heal is None  # line start: no constraint
    kept = build_prompt(tok, text, at, heal_indent=False)  # the earlier prompt, for the A/B
    assert kept.heal is None and tok.decode(kept.ids).startswith("<|fim_prefix|>" + text[:at] + "<|fim_suffix|>")
    # typed Enter and the editor's indentation after the prompt was built: the same prompt and constraint
    ids, heal = extend_middle(tok, [1, 2], "x = 1\n    ", heal_last=False)
    assert ids == [1, 2] + tok.encode("x = 1\n   ", add_special_tokens=False) and heal is p.heal
    assert extend_middle(tok, [1, 2], "x = 1\n", heal_last=False)[1] is None


def test_after_indentation_the_engine_takes_the_best_code_token():
    """The first token is the target's argmax over the allowed tokens, in every mode, where the
    unconstrained argmax is not allowed (a blank's output row is made twice the winner's), and the
    blank the prompt left out is hidden from the text."""
    target = tiny.loaded(tiny.qwen2_config(), seed=3, scale=4.0)
    tok, engine = target.tokenizer, Engine(target)
    text = "def f(x):\n    y = x\n    \n"
    p = build_prompt(tok, text, text.rindex("    \n") + 4, multiline=True)
    logits = engine.runner.extend(p.ids)
    top = max(p.heal.allowed, key=lambda i: float(logits[i]))
    blank = tok.encode("    ", add_special_tokens=False)[0]
    assert blank not in p.heal.allowed and float(logits[top]) > 0
    with torch.no_grad():
        head = target.model.get_output_embeddings().weight
        head[blank] = 2 * head[top]
    engine = Engine(target)
    assert engine.complete(Request(prompt=p.ids, mode="ar", max_tokens=1)).token_ids == [blank]
    for mode in ("ar", "pld", "combined"):
        res = engine.complete(Request(prompt=p.ids, mode=mode, max_tokens=4, heal=p.heal,
                                      stops=p.stops))
        assert res.token_ids[:1] == [top], mode
        if top not in tok.added_tokens_decoder:
            assert res.text.startswith(tok.decode([top])[1:]), mode


def test_fim_completions_may_close_brackets_the_suffix_lacks():
    tok = tiny.qwen_tokenizer()
    text = "def f(\n\nx = 1\n"
    s = build_prompt(tok, text, text.index("(") + 1, multiline=True).stops
    gen = "self, level):\n    return level\n"
    assert gen[:s.cut(gen)].startswith("self, level):")  # FIM: the model saw no ")" in the suffix
    plain = build_prompt(tiny.tokenizer(), text, text.index("(") + 1, multiline=True).stops
    assert gen[:plain.cut(gen)] == "self, level"  # no FIM: a closer ends the completion
