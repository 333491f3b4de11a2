"""Test models without downloads: a small Llama target and EAGLE-3 drafts, plus a BPE tokenizer.

Four models share one tokenizer (trained with `tokenizers` on text generated here):

- ``target-exact``: every layer's ``o_proj`` and ``down_proj`` zeroed and ``lm_head = embed_tokens``,
  so the residual stream is the token's embedding and greedy decoding repeats the last token.
- ``draft-exact``: EAGLE-3 draft with ``fc = [0 | 0 | I]``, zeroed ``o_proj``/``down_proj`` and
  ``lm_head = target embed``: it predicts what ``target-exact`` does (acceptance near 100%).
- ``target-random``: random weights (a real-looking, non-trivial greedy output).
- ``draft-random``: random EAGLE-3 draft (acceptance near 0 against either target).

Pairs: ``exact`` = (target-exact, draft-exact), ``random`` = (target-random, draft-random).
Deterministic for a seed; cached under ``<root>/<hash of parameters>/``.

CLI: ``python -m bench fixtures [--root DIR] [--preset tiny|gpu-bound] [--hidden 512] [--layers 8] ...``
prints the folder.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from bench.errors import BenchUsageError
from bench.models.kimi_fixture import KimiParams
from bench.models.kimi_fixture import build as build_kimi
from bench.models.synthetic import (
    FixtureError,
    FixtureParams,
    build_draft,
    build_target,
    require_device,
)
from bench.models.tokenizer import build_tokenizer, copy_tokenizer, tokenizer_text
from bench.models.trained import build as build_trained
from bench.models.trained_params import TrainedParams

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = PROJECT_ROOT / "build" / "fixtures"
PAIRS = {"exact": ("target-exact", "draft-exact"), "random": ("target-random", "draft-random")}
DONE = ".complete"
AnyParams = Union[FixtureParams, TrainedParams, KimiParams]


# "gpu-bound": a Llama-3-8B-shaped target (7.2B parameters, 14 GB in bf16) whose decode step on one
# H200 takes milliseconds of GPU time, as a large model's does, where the tiny default is bound by
# the server's per-step CPU work. Drawn on the GPU (seconds, against many minutes on CPU); exact
# pair only, to halve the disk and time. "gpu-bound-deep" doubles its layers (14B parameters, 28 GB)
# with the same one-layer draft: what the draft sync of a fallback step costs should then halve, as
# it would shrink further next to a large MoE target.
_GPU_BOUND = FixtureParams(
    hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, device="cuda", random_pair=False
)
# "trained" (bench.models.trained): a target trained on a code corpus and a draft trained on it, with the
# Llama-3-8B width; "trained-gpu-bound" is the same set's 32-layer target (pass-through layers after
# the trained ones), whose step costs what an 8B model's does and whose outputs are the small one's.
_TRAINED = TrainedParams()
PRESETS: dict[str, AnyParams] = {
    "tiny": FixtureParams(),
    "gpu-bound": _GPU_BOUND,
    "gpu-bound-deep": dataclasses.replace(_GPU_BOUND, layers=64),
    "trained": _TRAINED,
    "trained-gpu-bound": _TRAINED,
    # "kimi" (bench.models.kimi_fixture): the user's model family, KimiK25ForConditionalGeneration with MLA
    # and MoE layers, tiny; exact and random pairs.
    "kimi": KimiParams(),
}
_PRESET_PAIRS = {"trained": "trained", "trained-gpu-bound": "trained-gpu-bound", "kimi": "kimi-exact"}

logger = logging.getLogger(__name__)


def default_pair(preset: str) -> str:
    """The pair a preset's set is used for unless another is named."""
    return _PRESET_PAIRS.get(preset, "exact")


def pairs_of(params: FixtureParams) -> dict[str, tuple[str, str]]:
    """The (target, draft) pairs a set generated with these parameters holds."""
    return {k: v for k, v in PAIRS.items() if params.random_pair or k != "random"}


@dataclass(frozen=True)
class Fixtures:
    root: Path

    def path(self, name: str) -> Path:
        return self.root / name

    def _manifest(self) -> dict[str, Any] | None:
        manifest = self.root / "manifest.json"
        return json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else None

    def pairs(self) -> dict[str, tuple[str, str]]:
        manifest = self._manifest()
        if manifest is None:
            return dict(PAIRS)
        return {k: (v[0], v[1]) for k, v in manifest["pairs"].items()}

    def prompts_file(self) -> Path | None:
        """The prompts the set was made with (the trained set's held-out code), if it has any."""
        entry = (self._manifest() or {}).get("prompts")
        return self.root / entry["file"] if entry else None

    def pair(self, kind: str) -> tuple[Path, Path]:
        pairs = self.pairs()
        if kind not in pairs:
            raise FixtureError(
                f"{self.root} has no {kind} pair, only {', '.join(sorted(pairs))}: use one of "
                "those, or the preset that generates it"
            )
        target, draft = pairs[kind]
        return self.root / target, self.root / draft


def _build_synthetic(tmp: Path, params: FixtureParams, quiet: bool) -> dict[str, Any]:
    """The exact (and random) pairs into tmp; returns the manifest."""
    tokdir = tmp / "tokenizer"
    vocab = build_tokenizer(tokdir, params.vocab, tokenizer_text(params.seed))
    pairs = pairs_of(params)
    embed = None
    for name, exact, seed in (("target-exact", True, params.seed), ("target-random", False, params.seed + 1)):
        if not exact and not params.random_pair:
            continue
        if not quiet:
            logger.info(
                f"fixtures: writing {name} (H={params.hidden}, L={params.layers}, V={vocab}, on {params.device})"
            )
        target_embed = build_target(tmp / name, params, vocab, exact, seed)
        if exact:
            embed = target_embed
    assert embed is not None
    build_draft(tmp / "draft-exact", params, vocab, embed, True, params.seed + 2)
    if params.random_pair:
        build_draft(tmp / "draft-random", params, vocab, embed, False, params.seed + 3)
    copy_tokenizer(tokdir, tmp, pairs)
    return {"params": dataclasses.asdict(params), "key": params.key(), "vocab": vocab, "pairs": pairs}


def writer_tag() -> str:
    """The folder that keeps the sets one major transformers release wrote. Its checkpoints and
    tokenizers need not load under another: 5.x saves the fast tokenizer as `TokenizersBackend`,
    which 4.x cannot import, and one machine can serve release lines of both."""
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "transformers-none"
    return "transformers-" + version.split(".")[0]


def _older_writers_set(base: Path, tag: str, key: str) -> Path | None:
    """The trained set of this key that an older major transformers release wrote, if one is here.

    Such a set loads under a newer release (4.57's under 5.12: the same configs and tokenization,
    checked on CPU), not the other way round, and training it again would cost a GPU machine
    minutes when one session serves release lines of both.
    """
    major_text = tag.rpartition("-")[2]
    major = int(major_text) if major_text.isdigit() else 0
    for older in range(major - 1, 0, -1):
        if (base / f"transformers-{older}" / key / DONE).is_file():
            return base / f"transformers-{older}" / key
    return None


def generate(params: AnyParams | None = None, root: Path | None = None, *, quiet: bool = False) -> Fixtures:
    """Build (or reuse) the fixture models; return where they are."""
    params = params or FixtureParams()
    base = Path(root or os.environ.get("SGL_FIXTURE_DIR") or DEFAULT_ROOT)
    tag = writer_tag()
    root = base / tag
    dest = root / params.key()
    if (dest / DONE).is_file():
        return Fixtures(dest)
    older = _older_writers_set(base, tag, params.key()) if isinstance(params, TrainedParams) else None
    if older is not None:
        return Fixtures(older)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{params.key()}-", dir=root))
    try:
        if isinstance(params, TrainedParams):
            require_device(params.device)
            manifest = build_trained(tmp, params, quiet)
        elif isinstance(params, KimiParams):
            manifest = build_kimi(tmp, params, quiet)
        else:
            manifest = _build_synthetic(tmp, params, quiet)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        (tmp / DONE).write_text("ok\n")
        if (dest / DONE).is_file():  # another process (a parallel sweep) finished first: use its set
            shutil.rmtree(tmp, ignore_errors=True)
            return Fixtures(dest)
        if dest.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):  # the writer's folder, if this was its first set
            root.rmdir()
        raise
    return Fixtures(dest)


def _param_names() -> list[str]:
    """The parameters of every kind of set, each once."""
    names: list[str] = []
    for cls in (FixtureParams, TrainedParams, KimiParams):
        names += [f.name for f in dataclasses.fields(cls) if f.name not in names]
    return names


def _param_flags(ap: argparse.ArgumentParser) -> None:
    """One option per parameter of any kind of set, typed by its first default."""
    defaults = [cls() for cls in (FixtureParams, TrainedParams, KimiParams)]
    for name in _param_names():
        value = next(getattr(d, name) for d in defaults if hasattr(d, name))
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            ap.add_argument(flag, type=type(value), default=None)


DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--root", type=Path, default=None, help=f"cache root (default $SGL_FIXTURE_DIR or {DEFAULT_ROOT})")
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="tiny",
        help="starting parameters, changed by the options below (default %(default)s)",
    )
    _param_flags(ap)
    ap.add_argument("--json", action="store_true", help="print the model paths as JSON")


def command(args: argparse.Namespace) -> int:
    """`python -m bench fixtures`: build (or find) a set and print where it is; errors go to
    bench.cli.main, which maps them to exit codes."""
    base = PRESETS[args.preset]
    own = {f.name for f in dataclasses.fields(base)}
    changed = {n: getattr(args, n) for n in _param_names() if getattr(args, n) is not None}
    foreign = sorted(set(changed) - own)
    if foreign:
        raise BenchUsageError(
            f"preset {args.preset} has no parameter {', '.join('--' + n.replace('_', '-') for n in foreign)}"
        )
    fx = generate(dataclasses.replace(base, **changed), args.root)
    if args.json:
        print(json.dumps({k: {"target": str(fx.pair(k)[0]), "draft": str(fx.pair(k)[1])} for k in fx.pairs()}))
    else:
        print(fx.root)
    return 0
