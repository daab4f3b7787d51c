# SPDX-License-Identifier: Apache-2.0
"""Writes a tiny random Llama (2 layers, weights and tokenizer made here, no
download) to the directory given: what the image's `vllm` role serves in
tests/packaging/test_image.py. Runs inside the image (its transformers)."""

import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 1024
out = sys.argv[1]
words = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(3, VOCAB))]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
    bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
)  # fmt: skip
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
print(out)
