"""completiond: local code completion with lossless speculative decoding."""

import os

__version__ = "0.1.0"

# OpenMP threads that wait sleep instead of spinning. libgomp (torch's, which completiond's kernels
# share) reads this once, when torch loads, so it is set here, before any import of torch. A pass
# opens a few parallel regions per layer; beside one busy process (a build, a language server
# re-checking the file just typed in) a spinning thread burns the time slices its descheduled
# partner needs: 1.5B passes of 1 / 8 nodes took 197 / 357 ms spinning, 103 / 202 ms sleeping. On
# an idle machine sleeping costs 58 -> 78 / 117 -> 149 ms (python -m benchmarks.experiments omp_wait, 2 cores, 2
# threads). A user's own OMP_WAIT_POLICY wins (`active` for a machine kept idle for completions).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
