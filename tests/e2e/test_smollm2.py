"""The real demo model: loom's greedy chat answers equal transformers' on the same GGUF."""

from __future__ import annotations

import os

import pytest
import torch

from loom import LLM, SamplingParams

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "List three prime numbers."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hf_model_and_tokenizer(smol_gguf, smol_hf_checkpoint):
    """transformers' LlamaForCausalLM with its own reading of the GGUF (conftest), and its
    tokenizer for the same file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    config, tensors, _ = smol_hf_checkpoint
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    directory, name = os.path.split(smol_gguf)
    return model.eval(), AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.mark.slow
def test_greedy_chat_equals_transformers(smol_gguf, hf_model_and_tokenizer):
    hf, hf_tok = hf_model_and_tokenizer
    llm = LLM(smol_gguf, dtype="float32", device="cpu", max_model_len=512)
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs = llm.chat(conversations, params, use_tqdm=False)
    for conv, out in zip(conversations, outputs):
        ids = hf_tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert out.prompt_token_ids == list(ids)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.eos_token_id)
        ref_ids = ref[0, len(ids):].tolist()
        got = out.outputs[0].token_ids
        assert got == ref_ids[:len(got)] and len(got) == len(ref_ids)
        assert out.outputs[0].text == hf_tok.decode(got, skip_special_tokens=True)
