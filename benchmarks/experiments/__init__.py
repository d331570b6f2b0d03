"""Experiments: measurements that decided something (docs/decisions.md has each verdict), kept so
that a decision can be measured again. One CLI for all of them:

    python -m benchmarks.experiments                 # list them with their one-line purpose
    python -m benchmarks.experiments NAME [ARGS...]  # run one (NAME --help for its options)
"""
