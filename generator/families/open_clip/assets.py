"""open_clip assets: preprocess params, ``tokenizer.json``, ONNX towers and a tiny test model.

Tokenizer parity. The tokenize step first runs open_clip's own text clean in Python
(:mod:`embed_runtime.text.clip_clean`: ``ftfy.fix_text``, ``html.unescape`` twice,
whitespace, lower case), so every HTML entity, mojibake repair and control character is
handled as open_clip handles it. :func:`write_tokenizer_json` then rebuilds open_clip's
``SimpleTokenizer`` (clean ``'lower'``) as a ``tokenizers`` pipeline: the same byte-level
BPE vocab and merges (``</w>`` suffix), pre-tokenizer regex and special tokens,
truncation that keeps ``<end_of_text>`` last, padding with id 0; its normalizer only
drops U+0345, as open_clip's case-insensitive split does. Every assigned code point
tokenizes identically alone and in context (checked over all of them). What cannot be
matched is refused at serve time, per request (:class:`~embed_runtime.text.clip_clean.TextClean`):

- ``<start_of_text>`` / ``<end_of_text>`` typed right after punctuation (``!!<end_of_text>``):
  open_clip's split regex joins them to the punctuation, a served tokenizer always
  splits them out;
- letters and digits of Unicode versions newer than the served split's tables (U+0558,
  Unicode 16): the ``regex`` module classes them otherwise (:func:`_split_disagreements`,
  computed at build, written as the step's ``refused_code_points``).

Every build checks the served path (clean, refusals, ``tokenizer.json``) against
open_clip's tokenizer on :data:`VALIDATION_TEXTS` and :data:`HARD_TEXTS` and refuses a
tokenizer that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embed_runtime.image.preprocess import PreprocessParams, preprocess
from embed_runtime.text.clip_clean import TextClean
from embed_runtime.text.tokenizer import TokenizerParams

from ...declared_kind import UnsupportedModelError
from ...onnx_export import (
    ExportValidationError,
    GraphSpec,
    ParityReport,
    TensorSpec,
    export_module,
    validate_graph,
)
from ...precision import apply_precision
from .preprocess_cfg import PreprocessChoice, check_resolved
from .support import check_reproducible

VALIDATION_TEXTS = (
    "a photo of a cat",
    "A diagram of Triton batching requests from many clients into one execution.",
    "¿Dónde está la biblioteca? 東京は日本の首都です。",
    "emoji 🙂🚀 and punctuation!!! ... ???",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 20,
)
# Captions that only open_clip's exact clean gets right: checked at every build.
HARD_TEXTS = (
    "&#233;t&#xe9; &#8212; &#x2014; &#X27;&#0233;",
    "&hearts; &#8364; &EACUTE; &EURO; &Eacute; &eacute &amp;amp;amp;lt;b&amp;amp;amp;gt;",
    "fish &amp chips &AMP; &lt;b&gt; &#38;#38; &#x26;amp; &# &#x; &#; &bogus; & ;",
    "<b> &ldquo;quoted&rdquo;</b> <a href='x?a=1&amp;b=2'>link</a> [b]bb[/b]",
    "cafÃ© naÃ¯ve rÃ©sumÃ© â€œquotedâ€\x9d donâ€™t Ã¢â‚¬Å“doubleÃ¢â‚¬",
    "ＦＵＬＬ＆ａｍｐ；width ﬁne ｶﾞ \x1b[31mred\x1b[0m a\x00b\x85c\x93q\x94",
    "zero\u200bwidth\u200d \u202eevil\u202c \u2066iso\u2069 \ufeffbom \u00ad soft",
    "family 👨‍👩‍👧‍👦 flag 🇩🇪 👍🏽 ❤️ 1️⃣ ᶯΣ ΟΔΥΣΣΕΥΣ",
    "עברית &amp; العربية ١٢٣ (https://example.com/a?b=c&d=e#frag)",
    "&nbsp;&#160;&NBSP; ",
)


def preprocess_params_from_model(model_or_preprocess_cfg, **overrides) -> PreprocessParams:
    """:class:`PreprocessParams` from a model, a ``PreprocessCfg`` or its dict.

    open_clip's quirks are resolved here: interpolation ``'random'`` means bicubic at
    eval time, and the non-square 'shortest' path always resizes bicubic.
    """
    import dataclasses  # noqa: PLC0415

    import open_clip  # noqa: PLC0415

    cfg = model_or_preprocess_cfg
    if dataclasses.is_dataclass(cfg):
        cfg = dataclasses.asdict(cfg)
    elif not isinstance(cfg, dict):
        cfg = open_clip.get_model_preprocess_cfg(cfg)
    size = cfg.get("size", 224)
    size = (int(size), int(size)) if isinstance(size, int) else (int(size[-2]), int(size[-1]))
    mean = cfg.get("mean") or open_clip.OPENAI_DATASET_MEAN
    std = cfg.get("std") or open_clip.OPENAI_DATASET_STD
    mean, std = ((v if isinstance(v, (list, tuple)) else (v,) * 3) for v in (mean, std))
    resize_mode = cfg.get("resize_mode") or "shortest"
    interpolation = "bilinear" if cfg.get("interpolation") == "bilinear" else "bicubic"
    if resize_mode == "shortest" and size[0] != size[1]:
        interpolation = "bicubic"
    values = dict(
        size=size,
        resize_mode=resize_mode,
        interpolation=interpolation,
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        fill_color=int(cfg.get("fill_color", 0)),
    )
    values.update(overrides)
    return PreprocessParams(**values)


def _clip_normalizer():
    """The split's own quirk alone; the text arrives cleaned (``embed_runtime.text.clip_clean``)."""
    from tokenizers import normalizers  # noqa: PLC0415

    # U+0345 (combining ypogegrammeni) is dropped by open_clip's IGNORECASE split regex
    return normalizers.Sequence([normalizers.Replace("\u0345", " ")])


def write_tokenizer_json(open_clip_tokenizer, path: Path, context_length: int) -> TokenizerParams:
    """Write a ``tokenizers`` JSON equivalent to open_clip's ``SimpleTokenizer``.

    Returns the tokenize step's params: with them, the serve-time path (the clean, then
    ``Tokenizer.from_file(path).encode_batch``) yields ids of length ``context_length``
    equal to ``open_clip_tokenizer(texts)`` or refuses the text (module docstring);
    checked on :data:`VALIDATION_TEXTS` and :data:`HARD_TEXTS` before the file is
    written (:class:`ExportValidationError` otherwise). Raises NotImplementedError for
    other tokenizers (open_clip's ``HFTokenizer`` is served by :mod:`.hf_tokenizer`) and
    for non-default cleaning or reduction.
    """
    from open_clip.tokenizer import SimpleTokenizer  # noqa: PLC0415
    from tokenizers import (  # noqa: PLC0415
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tok = open_clip_tokenizer
    if not isinstance(tok, SimpleTokenizer):
        raise NotImplementedError(
            f"only open_clip's SimpleTokenizer (CLIP BPE) can be written as tokenizer.json; "
            f"got {type(tok).__name__} (an HFTokenizer goes through hf_tokenizer.py)"
        )
    if getattr(tok.clean_fn, "__name__", "") != "_clean_lower" or tok.reduction_fn is not None:
        raise NotImplementedError("only SimpleTokenizer(clean='lower') without reduction_mask")
    merges = [pair for pair, _ in sorted(tok.bpe_ranks.items(), key=lambda kv: kv[1])]
    tokenizer = Tokenizer(
        models.BPE(vocab=dict(tok.encoder), merges=merges, end_of_word_suffix="</w>")
    )
    tokenizer.normalizer = _clip_normalizer()
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    specials = [tok.decoder[i] for i in tok.all_special_ids]
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=True) for s in specials])
    sot, eot = tok.decoder[tok.sot_token_id], tok.decoder[tok.eot_token_id]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{sot} $A {eot}",
        pair=f"{sot} $A {eot} $B {eot}",
        special_tokens=[(sot, tok.sot_token_id), (eot, tok.eot_token_id)],
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("</w>", "\u0120"), decoders.ByteLevel()]
    )
    tokenizer.enable_truncation(max_length=context_length)
    tokenizer.enable_padding(length=context_length, pad_id=0, pad_token=tok.decoder[0])
    params = TokenizerParams(
        context_length,
        True,
        ("input_ids",),
        text_clean=tok.clean_fn.__name__,
        piece_start_tokens=(sot, eot),
        refused_code_points=_split_disagreements(tok, tokenizer),
    )
    _check_served(tok, tokenizer, params, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    tmp.replace(path)
    return params


def _split_disagreements(tok, tokenizer) -> tuple[str, ...]:
    """Code points open_clip's split regex and the served pre-tokenizer class differently.

    As hex ranges (``"558"``, ``"58b-58c"``), refused at serve time. Candidates are the code
    points Python's Unicode tables (what ftfy and ``lower`` read) leave unassigned but the
    ``regex`` module's newer ones assign (Unicode 15+ letters and digits: 17,144 with the
    pinned versions; checked over every code point once, none else differ); each is split
    in a letter and a punctuation context by both.
    """
    import unicodedata  # noqa: PLC0415

    import regex  # noqa: PLC0415

    unassigned = "".join(chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cn")
    candidates = regex.findall(r"\P{Cn}", unassigned)
    probe = "".join(f"a{c}a !{c}! " for c in candidates)
    want = {m.span() for m in tok.pat.finditer(probe)}
    got = {span for _, span in tokenizer.pre_tokenizer.pre_tokenize_str(probe)}
    codes = sorted({ord(candidates[start // 8]) for start, _ in want ^ got})
    ranges, first = [], None
    for i, code in enumerate(codes):
        first = code if first is None else first
        if i + 1 == len(codes) or codes[i + 1] != code + 1:
            ranges.append(f"{first:x}" if first == code else f"{first:x}-{code:x}")
            first = None
    return tuple(ranges)


def _check_served(tok, tokenizer, params: TokenizerParams, path: Path) -> None:
    """Refuse the tokenizer where the served ids differ from open_clip's on a check text.

    The served ids are the serve-time path's (the clean, then ``tokenizer``); a text that
    path refuses is left out, as it is at serve time.
    """
    texts = [*VALIDATION_TEXTS, *HARD_TEXTS, *(t.upper() for t in HARD_TEXTS)]
    clean = TextClean(params.text_clean, params.piece_start_tokens, params.refused_code_points)
    served = {t: c for t in texts if (c := clean.served(t)) is not None}
    texts = list(served)
    want = tok(texts, context_length=params.max_length).numpy()
    got = tokenizer.encode_batch([served[t] for t in texts])
    wrong = [t for t, w, g in zip(texts, want, got, strict=True) if list(w) != g.ids]
    if wrong:
        raise UnsupportedModelError(
            f"open_clip SimpleTokenizer at {path.name}: the served ids differ from open_clip's "
            f"on {len(wrong)} check texts, e.g. {wrong[0][:60]!r}; refused rather than served "
            "with another tokenization"
        )


def _tower(model, method: str):
    import torch  # noqa: PLC0415

    class Tower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.clip = model

        def forward(self, inputs):
            return getattr(self.clip, method)(inputs, normalize=True)

    return Tower().eval()


def text_tower(model):
    """``nn.Module``: ``input_ids`` [N, L] int64 -> L2-normalised text embedding [N, D]."""
    return _tower(model, "encode_text")


def image_tower(model):
    """``nn.Module``: ``pixel_values`` [N, 3, H, W] -> L2-normalised image embedding [N, D]."""
    return _tower(model, "encode_image")


def embedding_dim(model, context_length: int, image_size: int | tuple[int, int]) -> int:
    """Width D of the joint embedding space, read from the towers' own outputs.

    Asked through open_clip's interface (``encode_text`` / ``encode_image`` on a sample),
    never from ``text_projection`` or a timm tower's ``output_dim``: ``CustomTextCLIP``
    (MobileCLIP, EVA, SigLIP), CoCa and Hugging Face text towers have neither. Raises
    ValueError when the two towers disagree.
    """
    import torch  # noqa: PLC0415

    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    with torch.no_grad():
        text = model.encode_text(torch.zeros(1, context_length, dtype=torch.long))
        image = model.encode_image(torch.zeros(1, 3, *size))
    if text.shape[-1] != image.shape[-1]:
        raise ValueError(
            f"text tower gives {text.shape[-1]} values, image tower {image.shape[-1]}: "
            "not one joint embedding space"
        )
    return int(text.shape[-1])


def score_parameters(model) -> dict[str, str]:
    """``logit_scale`` and, where the model has one (SigLIP), ``logit_bias`` as config values.

    ``logit_scale`` is the multiplier itself, ``logit_scale.exp()`` as open_clip's forward
    returns it (the parameter holds its log). Values are the float32 numbers written
    exactly (``repr`` of the float), so a client reproduces open_clip's scores:
    ``sigmoid(image @ text.T * logit_scale + logit_bias)``, or a softmax without a bias.
    """
    import torch  # noqa: PLC0415

    values = {}
    for key, transform in (("logit_scale", torch.exp), ("logit_bias", None)):
        tensor = getattr(model, key, None)
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            tensor = tensor.detach().float()
            values[key] = repr(float((transform(tensor) if transform else tensor).item()))
    return values


def text_graph_spec(context_length: int, dim: int) -> GraphSpec:
    """Graph of the text encoder: ``input_ids`` [L] int64 -> ``EMBEDDING`` [D] float32."""
    return GraphSpec(
        inputs=(TensorSpec("input_ids", "int64", (context_length,)),),
        outputs=(TensorSpec("EMBEDDING", "float32", (dim,)),),
    )


def image_graph_spec(image_size: tuple[int, int], dim: int) -> GraphSpec:
    """Graph of the image encoder: ``pixel_values`` [3, H, W] -> ``EMBEDDING`` [D]."""
    return GraphSpec(
        inputs=(TensorSpec("pixel_values", "float32", (3, *image_size)),),
        outputs=(TensorSpec("EMBEDDING", "float32", (dim,)),),
    )


def _image_cases(image_size: tuple[int, int]) -> list[dict[str, np.ndarray]]:
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(0)
    params = PreprocessParams(size=image_size)
    height, width = image_size
    grid = np.mgrid[0 : height * 2, 0 : width * 3].astype(np.float32)
    art = np.stack([grid[0] * 2, grid[1], grid[0] + grid[1]], axis=-1) % 256
    real = preprocess(Image.fromarray(art.astype(np.uint8)), params)[None]
    cases = [{"pixel_values": real}]
    for batch in (1, 3, 5):
        noise = rng.standard_normal((batch, 3, height, width), dtype=np.float32)
        cases.append({"pixel_values": noise})
    return cases


def _text_cases(tokenizer, context_length: int) -> list[dict[str, np.ndarray]]:
    ids = tokenizer(list(VALIDATION_TEXTS), context_length=context_length).numpy()
    ids = ids.astype(np.int64)
    return [{"input_ids": ids[:1]}, {"input_ids": ids[1:4]}, {"input_ids": ids}]


def export_towers(
    model,
    out_dir: Path,
    context_length: int,
    image_size: int | tuple[int, int],
    tokenizer=None,
    precision: str = "fp32",
) -> dict[str, ParityReport]:
    """Export ``text_encoder.onnx`` and ``image_encoder.onnx`` and check both vs PyTorch.

    Validation runs real tokenized sentences (batch 1, 3, 6) and a preprocessed image
    plus random pixels (batch 1, 3, 5) at atol 1e-4 / min cosine 0.9999; a ``precision``
    other than fp32 then derives and checks that graph (:mod:`generator.precision`).
    Failures of both graphs are raised together as one :class:`ExportValidationError`.
    """
    import torch  # noqa: PLC0415
    from open_clip.tokenizer import SimpleTokenizer  # noqa: PLC0415

    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    tokenizer = tokenizer or SimpleTokenizer(context_length=context_length)
    model = model.eval()
    dim = embedding_dim(model, context_length, size)
    jobs = {
        "text_encoder": (
            text_tower(model),
            text_graph_spec(context_length, dim),
            _text_cases(tokenizer, context_length),
        ),
        "image_encoder": (image_tower(model), image_graph_spec(size, dim), _image_cases(size)),
    }
    reports, failures = {}, []
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused MHA kernel has no ONNX export
    try:
        for name, (module, spec, cases) in jobs.items():
            path = out_dir / f"{name}.onnx"
            sample = {k: torch.from_numpy(v) for k, v in cases[-1].items()}
            try:
                export_module(module, spec, sample, path)
                reports[name] = validate_graph(path, spec, module, cases, 1e-4, 0.9999)
                derived = apply_precision(path, precision, spec, module, cases)
                if derived is not None:
                    reports[f"{name}.{precision}"] = derived
            except ExportValidationError as exc:
                failures += [f"{name}: {f}" for f in exc.failures]
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    if failures:
        raise ExportValidationError(out_dir, failures)
    return reports


def load_open_clip(
    arch: str,
    pretrained: str | None = None,
    checkpoint: str | None = None,
    preprocess: PreprocessChoice | None = None,
):
    """``(model, eval_preprocess, tokenizer)`` for a manifest entry.

    ``arch`` is an open_clip architecture name, ``local-dir:``/``hf-hub:`` source, or a
    path to an architecture JSON (registered with ``open_clip.add_model_config``; its
    file stem is the architecture name). ``checkpoint`` is a local weights file.
    ``preprocess`` (the entry's ``preprocess_of`` / ``image_*`` keys) reaches open_clip as
    ``force_image_size`` and ``force_preprocess_cfg``, as ``create_model_and_transforms``
    passes its own ``image_*`` arguments.
    """
    import open_clip  # noqa: PLC0415
    from open_clip.transform import PreprocessCfg, image_transform_v2  # noqa: PLC0415

    if arch.endswith(".json") and Path(arch).is_file():
        open_clip.add_model_config(Path(arch))
        arch = Path(arch).stem
    try:  # first: a Hugging Face tokenizer that is neither local nor reachable fails fast
        tokenizer = open_clip.get_tokenizer(arch)
    except (OSError, ValueError) as exc:
        hf_name = (open_clip.get_model_config(arch) or {}).get("text_cfg", {})
        raise UnsupportedModelError(
            f"arch {arch!r}: its text tower uses the Hugging Face tokenizer "
            f"{hf_name.get('hf_tokenizer_name', '?')!r}, which could not be loaded "
            f"({str(exc).splitlines()[0][:200]}); offline, give arch = 'local-dir:<folder>' "
            "holding open_clip_config.json, the weights and that tokenizer's files"
        ) from None
    overrides = _local_hf_text_model(arch)
    preprocess = preprocess or PreprocessChoice()
    try:
        model = open_clip.create_model(
            arch,
            pretrained=checkpoint or pretrained,
            force_image_size=preprocess.image_size,
            force_preprocess_cfg=preprocess.force_preprocess_cfg(arch),
            **overrides,
        )
    except OSError as exc:
        text_cfg = (open_clip.get_model_config(arch) or {}).get("text_cfg", {})
        if "hf_model_name" not in text_cfg and not arch.startswith("local-dir:"):
            raise
        raise UnsupportedModelError(
            f"arch {arch!r}: its text tower could not be created "
            f"({str(exc).splitlines()[0][:200]}); for a Hugging Face text model offline, give "
            "arch = 'local-dir:<folder>' holding open_clip_config.json, the weights, the "
            "tokenizer's files and the text model's config.json (save_pretrained)"
        ) from None
    check_resolved(preprocess, model.visual.preprocess_cfg)
    preprocess_val = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), False)
    check_reproducible(model, arch)
    return model.eval(), preprocess_val, tokenizer


def _local_hf_text_model(arch: str) -> dict:
    """``text_cfg`` override loading a ``local-dir:`` folder's HF text model from the folder.

    open_clip creates an ``hf_model_name`` text tower (XLM-R, NLLB, mT5, ... CLIP) from the
    hub's ``config.json`` even when the folder's weights replace it; where the folder holds
    that ``config.json`` (the text model's ``save_pretrained``), it is read from there.
    """
    if not arch.startswith("local-dir:"):
        return {}
    folder = Path(arch.removeprefix("local-dir:"))
    try:
        local = json.loads((folder / "open_clip_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # open_clip reports it
    text_cfg = local.get("model_cfg", {}).get("text_cfg", {})
    if not text_cfg.get("hf_model_name") or not (folder / "config.json").is_file():
        return {}
    # the folder's open_clip weights hold the text tower: no hub weights to load first
    return {"text_cfg": {**text_cfg, "hf_model_name": str(folder), "hf_model_pretrained": False}}
