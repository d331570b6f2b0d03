"""What the real-editor first-start tests of a named int4 target share (test_int4_first_start_nvim.py,
test_int4_first_start_vscode.py): a scratch cache where qwen2.5-coder-1.5b@int4 is not converted, and
the checks on the daemon that answered.

The scratch cache (COMPLETIOND_CACHE) links the real GGUFs and the 0.5B's converted runtime form (the
1.5B's draft) file by file from the user's cache, so only the 1.5B int4 converts; the calibration
cache is copied, the compiled kernels hard-linked. Nothing is written into the user's cache: every
write the daemon makes (conversion, digests, stamps, a rebuilt kernel) replaces a link in the scratch
folder, never writes through one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

TARGET = "qwen2.5-coder-1.5b@int4"
NAME, FORM = TARGET.split("@")
DRAFT = "qwen2.5-coder-0.5b"


def require_real_models() -> None:
    """Skip where the real models are not installed; fail instead under COMPLETIOND_E2E_REQUIRED=1
    (CI installs them: a broken install must not pass as a skip)."""
    from completiond.models.catalog import CODER_05B, CODER_15B, installed

    missing = [m.name for m in (CODER_15B, CODER_05B) if not installed(m)]
    if missing:
        reason = f"{', '.join(missing)} not installed: pip install -e '.[default-model]'"
        if os.environ.get("COMPLETIOND_E2E_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def _link_files(src: Path, dst: Path) -> None:
    dst.mkdir(mode=0o700, parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            (dst / f.name).symlink_to(f.resolve())


def scratch_cache(root: Path) -> Path:
    """A cache at `root` with the real GGUFs (assembled in the user's cache first if they are not yet)
    and the 0.5B's runtime form linked, calibration and kernels copied, and no 1.5B runtime form."""
    from completiond.models import loader
    from completiond.paths import cache_root

    user = cache_root()
    assert user.resolve() != root.resolve()
    root.mkdir(mode=0o700, parents=True)
    (root / "gguf").mkdir(mode=0o700)
    for name in (NAME, DRAFT):
        gguf = loader.named_gguf(name)  # the user's cache: verified (assembled once where it is not)
        (root / "gguf" / gguf.name).symlink_to(gguf.resolve())
        shutil.copy(gguf.with_suffix(".verified"), root / "gguf" / f"{gguf.stem}.verified")  # stat stamp, no re-hash
    draft_form = user / "runtime" / DRAFT
    if draft_form.is_dir():  # else the start converts the draft too, after the target
        _link_files(draft_form, root / "runtime" / DRAFT)
    if (user / "calibration").is_dir():  # this machine's measured pass costs: small, copied
        shutil.copytree(user / "calibration", root / "calibration")
    if (user / "kernels").is_dir():  # compiled kernels load only as the very file built (its inode):
        (root / "kernels").mkdir(mode=0o700)  # hard links (a copy is rebuilt: minutes on a busy machine)
        for f in (user / "kernels").iterdir():
            if f.name.endswith(".so"):
                try:
                    os.link(f, root / "kernels" / f.name)
                except OSError:  # another file system: the start builds its own
                    continue
                shutil.copy(f.with_name(f.name + ".sha256"), root / "kernels")
    assert not (root / "runtime" / NAME).exists()
    return root


def int4_weights(cache: Path) -> list[Path]:
    """The 1.5B's int4 weights files converted into `cache` (weights.<dtype>-int4[-<format>].safetensors)."""
    folder = cache / "runtime" / NAME
    return sorted(folder.glob(f"weights.*-{FORM}*.safetensors")) if folder.is_dir() else []


def check_converting(seen: list[tuple[str, float]]) -> None:
    """`seen`: the converting phase's (text the editor showed, progress in percent) as observed while
    the daemon started. The phase names the target in its one spelling and its progress moves."""
    assert seen, "the editor never showed the converting phase"
    assert all(f"converting {TARGET}" in text for text, _ in seen), seen
    progress = [p for _, p in seen]
    assert progress == sorted(progress), progress  # it only moves forward
    assert len(set(progress)) >= 3 and min(progress) < 100.0, progress  # seen under way, not only at its end


def check_daemon(st: dict, cache: Path) -> None:
    """The daemon that answered runs the int4 weights converted into the scratch cache."""
    assert st["state"] == "ready" and st["target"] == TARGET and st["quant"] == FORM, st
    weights = Path(st["weights_file"])
    assert weights in int4_weights(cache), (weights, int4_weights(cache))
    assert st["requests_served"] >= 1, st
