"""Per first step on real positions: the tree's size and predicted gain, what it accepted; and the
whole completion's ms with the first tree on / off (alternating per position)."""
import sys, time, statistics as S, torch
torch.set_num_threads(2)
from completiond.models import load
from completiond.core.engine import Engine, Request
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.bench import modes as M
import completiond.core.engine as E

target = sys.argv[1]; quant = sys.argv[2]; n = int(sys.argv[3])
lm = load(target, "target", "cpu", "auto", quant)
eng = Engine(lm, None)
eng.calibrate_cached()
root, label = resolve_repo("pypi:boltons==25.0.0")
pos = sample_positions(root, n, "both", 0)
files = M.index_repo(eng, root)
prep = M.prepare(eng, root, pos, True, 2048)
log = []
orig_first = Engine._first_step
def spy_first(self, st, proposers, ctx):
    before = st.accepted
    t = time.perf_counter()
    vals = []
    orig_prop = self._propose
    def p(*a, **k):
        tree = orig_prop(*a, **k); vals.append((len(tree), sum(tree.value[1:]))); return tree
    self._propose = p
    try:
        orig_first(self, st, proposers, ctx)
    finally:
        del self._propose
    log.append((vals[0][0], vals[0][1], st.accepted - before, (time.perf_counter() - t) * 1000))
Engine._first_step = spy_first
M.WARM_GAP = int(sys.argv[4]) if len(sys.argv) > 4 else M.WARM_GAP
cur = None
res = {True: [], False: []}
for rnd in range(2):
    for i, pp in enumerate(prep):
        cur = M.open_position(eng, files, pp, cur)
        for on in ((True, False) if (i + rnd) % 2 else (False, True)):
            E.BULK_ROWS = 32 if on else -1
            M.warm(eng, pp.prompt)
            r = eng.complete(Request(prompt=pp.prompt, mode="combined", max_tokens=64, stops=pp.stops, heal=pp.heal))
            res[on].append((r.ms_total, r.ms_first_token, len(r.token_ids)))
print("first steps: nodes, predicted gain, accepted, ms")
print(" mean nodes %.1f, mean predicted %.2f, mean accepted %.2f, ms p50 %.1f" % (
    S.mean(x[0] for x in log), S.mean(x[1] for x in log), S.mean(x[2] for x in log), S.median(x[3] for x in log)))
for on in (False, True):
    print("first tree", on, "p50 ms %.1f ttft p50 %.1f total %.0f" % (S.median(x[0] for x in res[on]), S.median(x[1] for x in res[on]), sum(x[0] for x in res[on])))
print("token_ms", eng.token_ms.value, "cost(1)", eng.budget.cost(1))
