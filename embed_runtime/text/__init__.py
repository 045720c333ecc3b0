"""Request-path text handling: tokenizers and the request options they read.

The batched tokenizers (single texts, pairs, chat templates) and the request options
(prompts, task, dimensions).
"""
