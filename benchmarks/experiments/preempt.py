"""Preemption delay (cancel.set() -> the worker is free) on the real Qwen2.5-Coder-0.5B, default serve
weights (dtype auto, quant auto). Run with PYTHONPATH=<package root> to measure a given version."""
import json, random, sys, sysconfig, threading, time
from pathlib import Path
import torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
import completiond
try:  # this layout, or a checkout from before the folders (the "before" run of the closing note)
    from completiond.core.engine import Engine, Request
    from completiond.core.forward.runner import Cancelled
except ImportError:
    from completiond.engine import Engine, Request
    from completiond.runner import Cancelled
from completiond.models.loader import load

target = load("qwen2.5-coder-0.5b", "target", "cpu", "auto", "auto")
tok = target.tokenizer
text = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text() * 3
ids = tok.encode(text, add_special_tokens=False)[:2048]
engine = Engine(target)
rng = random.Random(0)
out = {"version": str(Path(completiond.__file__).parent), "threads": torch.get_num_threads(),
       "dtype": str(target.dtype), "quant": target.meta.get("quant", "none"), "backend": engine.runner.backend}

def timed(fn):
    t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1000

def run_cancel(work, full_ms, n):
    delays = []
    for _ in range(n):
        ev = threading.Event(); done = {}
        def w():
            try: work(ev)
            except Cancelled: pass
            done["t"] = time.perf_counter()
        th = threading.Thread(target=w); th.start()
        time.sleep(rng.uniform(0.1, 0.9) * full_ms / 1000)
        t_set = time.perf_counter(); ev.set(); th.join()
        delays.append(round((done["t"] - t_set) * 1000, 1) if done["t"] > t_set else "done before")
    return delays

# 1) 2k-token prefill as a request (no reuse: the whole prompt each time)
engine.complete(Request(prompt=ids[:64], mode="ar", max_tokens=1, reuse_prefix=False))  # warm-up
full = timed(lambda: engine.complete(Request(prompt=ids, mode="ar", max_tokens=1, reuse_prefix=False)))
out["prefill_2k_ms"] = round(full, 1)
out["prefill_delays_ms"] = run_cancel(
    lambda ev: engine.complete(Request(prompt=ids, mode="ar", max_tokens=1, reuse_prefix=False, cancel=ev)), full, 6)

# 2) 16-node verify passes on a 2k-token cache, as the decode loop runs them (check between passes)
r = engine.runner
r.reset(); r.extend(ids)
tree = ids[100:116]; parents = [-1] + [i // 2 for i in range(15)]
r.forward(tree, parents, range(16))
full16 = min(timed(lambda: r.forward(tree, parents, range(16))) for _ in range(3))
out["verify16_ms"] = round(full16, 1)
try:  # the cancel as an argument of the pass; older versions read an attribute of the runner
    from completiond.core.forward.context import PassContext
except ImportError:
    PassContext = None
def verify_loop(ev):
    def check():
        if ev.is_set(): raise Cancelled()
    kw = {"ctx": PassContext(ev)} if PassContext else {}
    if PassContext is None:
        r.check = check  # a runner that checks between layers; an older one ignores it
    try:
        while True:
            check()
            r.forward(tree, parents, range(16), **kw)
    finally:
        r.check = None
out["verify16_delays_ms"] = run_cancel(verify_loop, full16 * 2, 10)

# 3) prefill cost by chunk size (what smaller chunks cost), new version only
if hasattr(r, "sync"):
    for c in (256, 512):
        out[f"prefill_2k_chunk{c}_ms"] = round(min(timed(lambda: (r.reset(), r.extend(ids, chunk=c))) for _ in range(2)), 1)
print(json.dumps(out))
