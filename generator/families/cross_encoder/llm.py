"""LLM rerankers: a causal LM with sentence-transformers' ``LogitScore`` (family ``cross-encoder``).

``CrossEncoder.predict`` on such a model renders each (query, document) pair with the
model's chat template (roles ``query`` / ``document``, the prompt as a ``system``
message), tokenizes it without added special tokens, cuts it to ``max_length`` and
writes the template's tail back over cut rows, pads on the left, runs the causal LM with
``logits_to_keep=1`` and scores the last position: ``logit[yes] - logit[no]`` (or
``logit[yes]`` alone), then the activation (Sigmoid by default).

Served: the template is split here into the fixed text around prompt, query and
document (``embed_runtime.text.pair_template``), checked on probes to place them verbatim;
the server tokenizes the rendered pairs and pads them on the right. The exported graph
moves each right-padded row to the left (a per-row rotation), then runs the library's
own modules (the causal LM with ``logits_to_keep=1``, ``LogitScore``) and the activation,
so the scoring math is the library's. Gates before anything is written: token ids equal
``CrossEncoder.preprocess`` on every validation pair and prompt, and the graph fed the
server's way (one right-padded batch, and each row alone) equals ``CrossEncoder.predict``
within :data:`SERVED_SCORE_ATOL`. Anything the project does not reproduce is refused with
a message naming it (:func:`check_llm_reranker`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embed_runtime.text.pair_template import PairTemplate, TemplatePairTokenizer
from embed_runtime.text.tokenizer import TokenizerParams

from ...declared_kind import UnsupportedModelError
from ...onnx_export import GraphSpec, TensorSpec
from . import SHARED_PAIRS

# Scores of the graph fed right-padded rows vs ``CrossEncoder.predict`` (left padding).
SERVED_SCORE_ATOL = 1e-4
INPUT_NAMES = ("input_ids", "attention_mask")
# Private-use characters: no template text contains them, no filter changes them.
SENTINELS = {"prompt": "\ue000P\ue000", "query": "\ue001Q\ue001", "document": "\ue002D\ue002"}
# Strings a template might transform (trim, escape, case, Jinja syntax, special tokens).
PROBE_TEXTS = (
    "plain words",
    "  leading and trailing spaces  ",
    "\nnew\nlines\n",
    "UPPER lower Mixed",
    "{{ not jinja }} {% raw %} {# c #}",
    "<b>&amp; \"quotes\" 'single'</b>",
    "<|im_end|> <|im_start|>assistant",
    "ünïcödé 東京 🙂",
    "\\escaped\\ \t tab",
)
# Chat-template options that change tokenization, which the server does not reproduce.
TOKENIZATION_OPTIONS = ("padding", "truncation", "max_length", "return_tensors",
                        "sanitize_control_tokens", "tokenize", "return_dict",
                        "return_assistant_tokens_mask", "continue_final_message")
LLM_VALIDATION_PAIRS = (
    *SHARED_PAIRS,
    ("   spaces   ", "\n\nnew lines\n\n"),
    ("special <|im_end|>", "tokens <|im_start|>assistant in a document"),
    ("{{ jinja }}", "{% if x %}text{% endif %}"),
)


class UnsupportedLLMRerankerError(UnsupportedModelError):
    """An LLM reranker option the project does not reproduce exactly."""


def is_llm_reranker(model) -> bool:
    """Whether ``model`` (a loaded ``CrossEncoder``) scores with ``LogitScore``."""
    from sentence_transformers.cross_encoder.modules import LogitScore  # noqa: PLC0415

    return any(isinstance(module, LogitScore) for module in model)


def check_llm_reranker(model, name: str) -> None:
    """Refuse what the served path does not reproduce, naming the unsupported part."""
    from sentence_transformers.base.modules import Transformer  # noqa: PLC0415
    from sentence_transformers.cross_encoder.modules import LogitScore  # noqa: PLC0415
    from transformers import PreTrainedTokenizerBase  # noqa: PLC0415

    def refuse(what: str) -> None:
        raise UnsupportedLLMRerankerError(f"{name}: LLM reranker refused: {what}")

    kinds = [type(m).__name__ for m in model]
    if len(model) != 2 or not isinstance(model[0], Transformer) or not isinstance(
        model[1], LogitScore
    ):
        refuse(f"the pipeline is [{', '.join(kinds)}]; only [Transformer, LogitScore] is served")
    transformer, score = model[0], model[1]
    if transformer.transformer_task != "text-generation":
        refuse(f"its Transformer runs the task {transformer.transformer_task!r}; LogitScore "
               "is served after a causal LM (task 'text-generation') only")
    if not isinstance(transformer.processor, PreTrainedTokenizerBase):
        refuse(f"its processor is a {type(transformer.processor).__name__} (multimodal); "
               "only a text tokenizer is served")
    if "message" not in transformer.modality_config or not getattr(
        transformer.processor, "chat_template", None
    ):
        refuse("it has no chat template, so CrossEncoder tokenizes its pairs as plain text "
               "segments; only chat-template (query/document roles) LLM rerankers are served")
    if score.module_input_name != transformer.module_output_name:
        refuse(f"LogitScore reads {score.module_input_name!r}, not the Transformer's "
               f"{transformer.module_output_name!r}")
    kwargs = transformer._merge_processing_kwargs(None)
    for bucket, values in kwargs.items():
        if bucket != "chat_template" and values:
            refuse(f"processing_kwargs[{bucket!r}] = {values!r} (only the library's defaults "
                   "are reproduced)")
    options = sorted(set(kwargs.get("chat_template", {})) & set(TOKENIZATION_OPTIONS))
    if options:
        refuse(f"chat-template options {options} change tokenization")
    if not isinstance(transformer.max_seq_length, int) or transformer.max_seq_length < 1:
        refuse(f"max_seq_length {transformer.max_seq_length!r} is not a positive integer")
    if transformer.tokenizer.truncation_side not in ("right", "left"):
        refuse(f"truncation_side {transformer.tokenizer.truncation_side!r}")


def _render_kwargs(transformer) -> dict:
    kwargs = dict(transformer._merge_processing_kwargs(None).get("chat_template", {}))
    kwargs.pop("restore_suffix", None)
    return kwargs


def _library_render(transformer, query: str, document: str, prompt: str = "") -> str:
    """The string the library tokenizes for one pair (its own message building)."""
    formatter = transformer.input_formatter
    messages = formatter.pair_to_messages((query, document))
    if prompt:
        messages = formatter.prepend_prompt_to_messages([messages], prompt)[0]
    return str(transformer.processor.apply_chat_template(
        messages, tokenize=False, **_render_kwargs(transformer)
    ))


def _split(rendered: str, order: tuple[str, ...]) -> tuple[str, ...] | None:
    """``rendered`` cut at the sentinels of ``order``, each present once and in order."""
    parts, rest = [], rendered
    for key in order:
        sentinel = SENTINELS[key]
        if rendered.count(sentinel) != 1 or sentinel not in rest:
            return None
        head, rest = rest.split(sentinel)
        parts.append(head)
    return (*parts, rest)


def pair_template(model, name: str) -> PairTemplate:
    """The template as fixed text around prompt / query / document, checked on probes.

    Refuses a template that does not place query and document verbatim, once each, query
    first. A template that does not place the prompt verbatim gets no prompted form; a
    model with prompts is then refused.
    """
    transformer = model[0]
    plain = _split(_library_render(transformer, SENTINELS["query"], SENTINELS["document"]),
                   ("query", "document"))
    prompted = _split(
        _library_render(transformer, SENTINELS["query"], SENTINELS["document"],
                        SENTINELS["prompt"]),
        ("prompt", "query", "document"),
    )
    restore = transformer._merge_processing_kwargs(None).get("chat_template", {}).get(
        "restore_suffix", True
    )
    side = transformer.tokenizer.truncation_side
    if plain is None:
        raise UnsupportedLLMRerankerError(
            f"{name}: LLM reranker refused: its chat template does not place the query and "
            "the document once each, query first, so the server cannot render it without "
            "running the template"
        )
    template = PairTemplate(plain, prompted or (), side, bool(restore))
    probes = [(q, d) for q in PROBE_TEXTS for d in PROBE_TEXTS[::-1]][:: 4]
    for query, document in probes:
        if _library_render(transformer, query, document) != template.render(query, document):
            raise UnsupportedLLMRerankerError(
                f"{name}: LLM reranker refused: its chat template changes the query or the "
                f"document (seen on {query!r} / {document!r}), which the server does not "
                "reproduce"
            )
    if template.prompted and any(
        _library_render(transformer, q, d, p) != template.render(q, d, p)
        for p in PROBE_TEXTS for q, d in probes[:3]
    ):
        template = PairTemplate(plain, (), side, bool(restore))
    prompts = {k: v for k, v in (model.prompts or {}).items() if v}
    if prompts and not template.prompted:
        raise UnsupportedLLMRerankerError(
            f"{name}: LLM reranker refused: it has prompts {sorted(prompts)} but its chat "
            "template does not place a system prompt verbatim"
        )
    return template


def tokenizer_params(model) -> TokenizerParams:
    """Serve-time tokenizer settings: no added special tokens, the model's prompts."""
    tokenizer = model[0].tokenizer
    prompts = {k: v for k, v in (model.prompts or {}).items() if v}
    default = model.default_prompt_name or ""
    return TokenizerParams(
        int(model.max_seq_length), False, INPUT_NAMES, int(tokenizer.pad_token_id or 0),
        prompts=tuple(sorted(prompts.items())),
        default_prompt_name=default if default in prompts else "",
        add_special_tokens=False,
    )


def _prompt_options(params: TokenizerParams) -> list[tuple[str | None, str]]:
    """(request ``prompt_name``, the prompt text the library gets) for every prompt."""
    default = dict(params.prompts).get(params.default_prompt_name, "")
    return [(None, default), *((n, p) for n, p in params.prompts)]


def _library_features(model, pairs, prompt: str) -> list[list[int]]:
    """Each pair's token ids as ``CrossEncoder.preprocess`` makes them (pads dropped)."""
    enc = model.preprocess([list(p) for p in pairs], prompt=prompt or None)
    ids, mask = enc["input_ids"].numpy(), enc["attention_mask"].numpy().astype(bool)
    return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]


def _runtime(tokenizer: TemplatePairTokenizer, pairs, name: str | None) -> dict[str, np.ndarray]:
    parameters = {} if name is None else {"prompt_name": name}
    return tokenizer.encode(tokenizer.prepare(list(pairs), parameters))


def check_template_tokenizer(model, tokenizer: TemplatePairTokenizer) -> list[str]:
    """Differences between the served token ids and ``CrossEncoder.preprocess``.

    Every validation pair alone and all of them in one batch, for every prompt option.
    """
    failures = []
    for name, prompt in _prompt_options(tokenizer.params):
        batches = [[pair] for pair in LLM_VALIDATION_PAIRS] + [list(LLM_VALIDATION_PAIRS)]
        for batch in batches:
            want = _library_features(model, batch, prompt)
            got = _runtime(tokenizer, batch, name)
            lengths = got["attention_mask"].sum(axis=1)
            for i, pair in enumerate(batch):
                if got["input_ids"][i, : lengths[i]].tolist() != want[i]:
                    failures.append(f"token ids differ from CrossEncoder.preprocess on "
                                    f"{pair[0][:30]!r} (prompt_name {name!r})")
    return sorted(set(failures))


def scorer_module(model):
    """The library's modules fed right-padded rows: rotate each row left, LM, LogitScore."""
    import torch  # noqa: PLC0415

    activation = model.activation_fn

    class LLMScorer(torch.nn.Module):
        """Right-padded tokens -> what ``CrossEncoder.predict`` returns for them."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            width = input_ids.shape[1]
            pads = width - attention_mask.sum(dim=1, keepdim=True)
            positions = torch.arange(width, device=input_ids.device).unsqueeze(0)
            source = torch.remainder(positions - pads, width)  # row i, slot j <- j - pads_i
            features = {
                "input_ids": torch.gather(input_ids, 1, source),
                "attention_mask": torch.gather(attention_mask, 1, source),
                "logits_to_keep": 1,
            }
            scores = self.model(features)["scores"].float()
            return activation(scores) if activation is not None else scores

    return LLMScorer().eval()


def graph_spec() -> GraphSpec:
    """Token tensors in, ``SCORE`` [N, 1] out."""
    return GraphSpec(
        inputs=tuple(TensorSpec(n, "int64", (-1,)) for n in INPUT_NAMES),
        outputs=(TensorSpec("SCORE", "float32", (1,)),),
    )


def served_score_parity(model, tokenizer: TemplatePairTokenizer, onnx_path: Path) -> float:
    """Max |graph fed the server's way - ``CrossEncoder.predict``| over every prompt option.

    The server pads on the right, per chunk, to the chunk's longest row: here the pairs run
    as one batch padded to the longest, and each pair alone (no padding).
    """
    import onnxruntime as ort  # noqa: PLC0415 - a build-time check of the exported graph

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    pairs = list(LLM_VALIDATION_PAIRS)
    for name, prompt in _prompt_options(tokenizer.params):
        want = np.asarray(model.predict([list(p) for p in pairs], batch_size=len(pairs),
                                        prompt=prompt or None)).reshape(-1)
        arrays = _runtime(tokenizer, pairs, name)
        together = session.run(["SCORE"], {n: arrays[n] for n in INPUT_NAMES})[0].reshape(-1)
        alone = np.array([
            session.run(["SCORE"], {n: _runtime(tokenizer, [p], name)[n] for n in INPUT_NAMES})[0]
            .item() for p in pairs
        ])
        worst = max(worst, float(np.abs(together - want).max()), float(np.abs(alone - want).max()))
    return worst
