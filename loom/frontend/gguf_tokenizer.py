"""Convert the tokenizer inside a GGUF file into a Hugging Face tokenizer directory.

Run as `python -m loom.frontend.gguf_tokenizer FILE.gguf OUTDIR`. It lives in its own
process because transformers imports torch, which the API server process must not; the
parent (`loom.frontend.tokenizer`) caches the result so this runs once per file.
"""

from __future__ import annotations

import os
import sys


def convert(gguf_path: str, out_dir: str) -> None:
    from transformers import AutoTokenizer

    directory, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    tokenizer.save_pretrained(out_dir)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m loom.frontend.gguf_tokenizer FILE.gguf OUTDIR", file=sys.stderr)
        return 2
    convert(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
