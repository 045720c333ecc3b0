"""Options that more than one subcommand of ``python -m client`` takes, declared once."""

from __future__ import annotations

import argparse

from .api import PRECISION_OUTPUTS


def add_text_options(
    parser: argparse.ArgumentParser, *, precision: str | None, per_chunk: str
) -> None:
    """The text model's options: prompt, dimensions, precision, chunk size and overlap.

    ``precision`` is the default of ``--precision``; ``per_chunk`` says what the command
    gives for each chunk when ``--chunk-tokens`` cuts the texts.
    """
    parser.add_argument("--prompt-name", help="one of the text model's prompts (e.g. query)")
    parser.add_argument("--dimensions", type=int, help="keep the first N values (Matryoshka)")
    parser.add_argument(
        "--precision",
        choices=list(PRECISION_OUTPUTS),
        default=precision,
        help="output form: float16, int8/uint8 (calibrated), binary/ubinary (packed bits)",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        help=f"cut each text into chunks of at most N of the model's tokens ({per_chunk})",
    )
    parser.add_argument("--chunk-overlap", type=int, help="tokens shared by neighbouring chunks")
