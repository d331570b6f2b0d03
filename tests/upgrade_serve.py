"""`completiond serve` with tiny models standing in for the named Qwen pair (tests/test_upgrade.py).

Run as `python tests/upgrade_serve.py serve ...`; $UPGRADE_TEST (JSON) says what stands in:
`ggufs` {named model: tiny GGUF path}, `larger_form` (the weights form this CPU "measured" fastest for
the larger target: it is then the CPU default; none: the pass-cost measurement decides as usual) and
`available_memory` (bytes the conversion and the switch see as available). Everything else is the
real daemon: its socket, loader, converter child process, scheduler and switch.
"""

import json
import os
import sys
from pathlib import Path

from completiond.models import choice, convert, loader

config = json.loads(os.environ["UPGRADE_TEST"])
ggufs = {name: Path(path) for name, path in config["ggufs"].items()}
real_gguf = loader.named_gguf  # where resolve, convert and the upgrade look named models up
loader.named_gguf = lambda name: ggufs[name] if name in ggufs else real_gguf(name)
if config.get("larger_form"):
    choice.cpu_default = lambda: choice.Choice(choice.MEASURED_PAIR[0], config["larger_form"],
                                               "its passes measured fast enough here (test)")
if config.get("available_memory") is not None:
    convert.available_memory = lambda: int(config["available_memory"])

from completiond.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
