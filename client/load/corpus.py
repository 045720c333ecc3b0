"""A fixed, varied text workload for parity tests and benchmarks (no network needed).

Short and long sentences, several scripts, punctuation, numbers and code; the long
ones exceed 256 word pieces so truncation is exercised.
"""

from __future__ import annotations

import random

SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "The new movie is so great!",
    "Do you like pizza?",
    "I love pasta with a lot of garlic.",
    "Dynamic batching groups requests that arrive within a short delay.",
    "Each Python backend instance runs in its own stub process.",
    "Embeddings map text and images into the same vector space.",
    "Cosine similarity ranks the nearest neighbours of a query.",
    "The quarterly report shows revenue grew by 12% year over year.",
    "Please reset my password; I can't log in since Tuesday.",
    "How do I configure an instance group with two GPU instances?",
    "Quantum entanglement links the states of two particles.",
    "Photosynthesis converts light energy into chemical energy.",
    "The Treaty of Westphalia was signed in 1648.",
    "Mount Everest is 8,849 metres tall.",
    "She sells sea shells by the sea shore.",
    "¿Dónde está la estación de tren más cercana?",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Mi piace molto la cucina italiana, soprattutto la pizza napoletana.",
    "Привет, как у тебя дела сегодня?",
    "東京は日本の首都であり、世界最大の都市圏の一つです。",
    "机器学习模型需要大量的数据进行训练。",
    "서울은 대한민국의 수도입니다.",
    "हिंदी भारत की सबसे अधिक बोली जाने वाली भाषा है।",
    "مرحبا بك في عالم الذكاء الاصطناعي",
    "Emoji test: 🙂🚀🔥 — does the tokenizer cope? 👍🏽",
    "Café naïve résumé coöperate façade jalapeño.",
    "Punctuation!!! Really??? Yes... (maybe) [probably] {certainly} <never>",
    "def embed(texts: list[str]) -> np.ndarray: return model.encode(texts)",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;",
    "curl -s localhost:8000/v2/health/ready && echo ready",
    "Call +1 (555) 010-9999 or write to support@example.com.",
    "Version 2.51.0 was released on 2024-10-31 at 09:15 UTC.",
    "Pi is approximately 3.14159265358979323846.",
    "x",
    "OK",
    "Why?",
    "tab\tseparated\tvalues and\nnew lines",
    "   surrounding spaces   ",
    "ALL CAPS SENTENCE SHOUTING ABOUT NOTHING",
    "mIxEd CaSe WoRdS aRe StIlL wOrDs",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism.",
    "The patient presented with acute myocardial infarction and was given aspirin.",
    "Plaintiff alleges breach of contract under section 4(b) of the agreement.",
    "Bake at 180°C for 25 minutes, then let it cool on a wire rack.",
    "The stock closed at $182.35, up 1.2% on heavy volume.",
    "A long time ago in a galaxy far, far away...",
    "To be, or not to be, that is the question.",
    "It was the best of times, it was the worst of times.",
)

LONG_TEXTS = (
    " ".join(SENTENCES[:30]),
    "Triton Inference Server serves models from a repository. " * 30,
    "长文本测试。" * 120,
    " ".join(f"token{i}" for i in range(400)),
)


def varied_sentences(n: int = 200, seed: int = 0) -> list[str]:
    """``n`` deterministic texts: every base sentence, long texts, then mixed pairs."""
    rng = random.Random(seed)  # noqa: S311 - a repeatable corpus, not a secret
    texts = list(SENTENCES) + list(LONG_TEXTS)
    while len(texts) < n:
        a, b = rng.sample(SENTENCES, 2)
        texts.append(f"{a} {b}" if rng.random() < 0.7 else a.lower())
    return texts[:n]
