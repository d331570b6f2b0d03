"""Heads on the target's hidden states (issue 16), Medusa and EAGLE-style: the engine feeds them the
hidden state its root came from, they load and fail with one line, and `train-draft heads` trains,
resumes and exports. Lossless: test_lossless.py and test_sampling.py run the same checks with both
kinds as the draft."""

import pytest
import torch

import tiny
from completiond.core.engine import Engine, Request
from completiond.models.heads import EagleHead, MedusaHeads, save_heads
from completiond.draft import heads as train_mod
from completiond.models.catalog import ModelError
from completiond.models.loader import load_draft


@pytest.fixture(scope="module")
def target():
    return tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)


def test_each_step_reads_the_hidden_state_its_root_came_from(target, code_ids):
    # zero blocks: z = h, so head 1's best guess is the token the target's own head makes of h,
    # which is the root when h is the right row (the bonus token's, or the prompt's last)
    heads = MedusaHeads(target.model.config.hidden_size, 2, torch.arange(target.vocab_size))
    e = Engine(target, heads, always_speculate=True)
    seen = []
    propose = e.heads.propose

    def spy(context, limits, ctx):
        out = propose(context, limits, ctx)
        seen.append((context[-1], out[0].tokens[0]))
        return out

    e.heads.propose = spy
    for start in (0, 300, 900):
        e.complete(Request(prompt=code_ids[start:start + 60], mode="draft", max_tokens=12))
    assert len(seen) >= 6
    assert all(root == guess for root, guess in seen)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_load_heads_round_trip_and_errors(target, tmp_path, kind):
    hidden, vocab = target.model.config.hidden_size, torch.arange(0, target.vocab_size, 2)
    heads = MedusaHeads(hidden, 3, vocab) if kind == "medusa" else EagleHead(hidden, 48, vocab)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.1)
    path = tmp_path / "h.safetensors"
    save_heads(heads, path, {"target": "tiny"})
    back = load_draft(f"{kind}:{path}", target)
    assert type(back) is type(heads) and torch.equal(back.vocab, heads.vocab)
    for (n, a), (_, b) in zip(back.named_parameters(), heads.named_parameters()):
        assert torch.allclose(a, b.to(torch.bfloat16).float()), n
    assert kind in back.name
    with pytest.raises(ModelError, match=f"no {kind} heads"):
        load_draft(f"{kind}:{tmp_path / 'missing.safetensors'}", target)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelError, match="not a heads file"):
        load_draft(f"{kind}:{tmp_path / 'junk.safetensors'}", target)
    save_heads(MedusaHeads(32, 3, torch.arange(10)), tmp_path / "narrow.safetensors", {"target": "other"})
    with pytest.raises(ModelError, match="width 32"):
        load_draft(f"{kind}:{tmp_path / 'narrow.safetensors'}", target)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_train_resume_and_export(target, tmp_path, monkeypatch, kind):
    out = tmp_path / "train"
    kw = dict(kind=kind, tokens=3000, k=2, vocab_size=200, batch=64, inner=48)
    untrained = MedusaHeads(64, 2, torch.arange(5)) if kind == "medusa" else EagleHead(64, 48, torch.arange(5))
    heads, report = train_mod.train_heads(target, out, steps=20, **kw)
    ckpt = out / kind / "checkpoint.pt"
    assert (out / "features.pt").exists() and ckpt.exists()
    assert len(report["top1_agreement"]) == 2 and report["vocab"] <= 200
    moved = [n for (n, a), (_, b) in zip(heads.named_parameters(), untrained.named_parameters())
             if a.shape == b.shape and not torch.equal(a, b)]
    assert moved  # it trained
    # resumed: the features are read back (never recomputed) and the steps continue from 20
    monkeypatch.setattr(train_mod, "features", lambda *a, **k: pytest.fail("features recomputed"))
    before = torch.load(ckpt)["step"]
    heads2, _ = train_mod.train_heads(target, out, steps=30, **kw)
    assert before == 20 and torch.load(ckpt)["step"] == 30
    path = train_mod.export(heads2, tmp_path / "tiny.safetensors", target, report)
    loaded = load_draft(f"{kind}:{path}", target)
    res = Engine(target, loaded).complete(Request(prompt=list(range(5, 40)), mode="combined", max_tokens=8))
    assert res.token_ids == Engine(target).complete(Request(prompt=list(range(5, 40)), mode="ar", max_tokens=8)).token_ids


def test_head_labels_stay_inside_a_window():
    part = {"greedy": torch.tensor([5, 6, 7, 8, 9, 10]), "window": torch.tensor([0, 0, 0, 1, 1, 1])}
    y = train_mod.labels(part, 2, torch.tensor([5, 6, 7, 9, 10]), 12)
    # head 1 at t learns g[t+1]; 8 is not in the sub-vocabulary; across windows: -100
    assert y[0].tolist() == [1, 2, -100, 3, 4, -100]
    assert y[1].tolist() == [2, -100, -100, 4, -100, -100]


def test_heldout_agreement_counts_labels_outside_the_sub_vocabulary():
    # one window of 6 positions; Medusa's single head at t guesses g_{t+1}: labels 0, 1, 5, 2, 0 (5 is
    # outside the sub-vocabulary {0, 1, 2}); zero weights read h out as it is, so h picks the guess
    guesses = [0, 1, 0, 0, 0, 0]  # hits at t = 0, 1, 4; a miss at t = 3; t = 2 has no label it can say
    part = {"h": torch.eye(4)[guesses].to(torch.bfloat16), "ids": torch.zeros(6, dtype=torch.int64),
            "greedy": torch.tensor([0, 0, 1, 5, 2, 0]), "window": torch.zeros(6, dtype=torch.int64)}
    vocab = torch.tensor([0, 1, 2])
    task = train_mod.Task("medusa", part, vocab, 6, 1, torch.eye(3, 4).to(torch.bfloat16), torch.zeros(6, 4))
    got = task.agreement(MedusaHeads(4, 1, vocab))
    assert got["positions"] == 5 and got["label_in_vocab"] == 0.8
    assert got["top1_agreement"] == [0.75] and got["top1_all"] == [0.6]
