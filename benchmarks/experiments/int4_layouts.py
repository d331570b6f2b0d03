"""int4 layouts compared in float (docs/decisions.md, "int4 formats"): the 1.5B's MLP weights quantized and
dequantized per layout, teacher-forced over toolz files against the unquantized model (top-1
agreement, mean KL). Needs the bench repositories in the cache and the 1.5B's bf16 form.

    python -m benchmarks.experiments int4_layouts sym128,sym64,sym32,asym128,asym64,asym32
"""
import sys
import time

import torch
import torch.nn.functional as F

from completiond.models.loader import load
from completiond.paths import cache_root
torch.set_num_threads(2)
files = sorted((cache_root() / "bench-repos").glob("*[!l]/*/*.py"))[:6]
t = load("qwen2.5-coder-1.5b", "target", "cpu", "bfloat16", "none")
ids = [t.tokenizer.encode(f.read_text(errors="replace"))[:384] for f in files]
ids = [i for i in ids if len(i) >= 64]
def run():
    with torch.inference_mode():
        return [t.model(torch.tensor([i])).logits[0].float() for i in ids]
ref = run()
n = sum(len(x) for x in ref)
mlps = [m for name, m in t.model.named_modules() if name.rsplit(".",1)[-1] in ("gate_proj","up_proj","down_proj")]
orig = [m.weight.data.clone() for m in mlps]
def q_sym(w, g, steps=(1.0,0.95,0.9,0.85,0.8)):
    n_, k = w.shape; wb = w.float().view(n_, k//g, g)
    peak = wb.gather(-1, wb.abs().argmax(-1, keepdim=True))
    best=None
    for f in steps:
        d = peak/(-8*f); d = torch.where(d==0, torch.ones_like(d), d)
        dq = torch.round(wb/d).clamp(-8,7)*d
        e = ((dq-wb)**2).sum(-1, keepdim=True)
        if best is None: best, bdq = e, dq
        else:
            m = e < best; best = torch.where(m, e, best); bdq = torch.where(m, dq, bdq)
    return bdq.view(n_, k)
def q_asym(w, g):
    n_, k = w.shape; wb = w.float().view(n_, k//g, g)
    lo, hi = wb.amin(-1, keepdim=True), wb.amax(-1, keepdim=True)
    s = ((hi-lo)/15).clamp(min=1e-12)
    q = torch.round((wb-lo)/s).clamp(0,15)
    return (q*s+lo).view(n_, k)
variants = {"sym128": lambda w: q_sym(w,128), "sym64": lambda w: q_sym(w,64), "sym32": lambda w: q_sym(w,32),
            "asym128": lambda w: q_asym(w,128), "asym64": lambda w: q_asym(w,64), "asym32": lambda w: q_asym(w,32),
            "sym128-rtn": lambda w: q_sym(w,128,(1.0,))}
for name in sys.argv[1].split(","):
    t0=time.time()
    for m, o in zip(mlps, orig):
        m.weight.data = variants[name](o).to(o.dtype)
    got = run()
    agree = sum((r.argmax(-1)==g.argmax(-1)).sum().item() for r,g in zip(ref,got))/n
    kl = sum(F.kl_div(g.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="sum").item() for r,g in zip(ref,got))/n
    print(f"{name:12} agree {agree:.4f} kl {kl:.4f} ({n} tokens, {time.time()-t0:.0f}s)", flush=True)
