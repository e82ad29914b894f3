"""A tiny random causal LM, an offline-trained tokenizer and a toy prompt set for integration tests.

Nothing here touches the Hugging Face Hub: the tokenizer is a byte-level BPE trained in memory with
``tokenizers`` and the model is a randomly initialised 2-layer Llama (hidden 32).
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a bad cat ate a banana and a carrot",
    "count the letters in this sentence and add them up",
    "two plus two is four, three plus three is six",
    "<|user|> <|assistant|> what is the answer? the answer is a",
]
PROMPTS = ["what is two plus two?", "name a fruit", "say a word with an a", "the lazy dog", "count to three"]


@functools.lru_cache(maxsize=1)
def _trained_tokenizer_json() -> str:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok.to_str()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh byte-level BPE tokenizer (~300 ids) with pad/bos/eos tokens and a minimal chat template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json()),
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, *, tied: bool = False, dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    """A random 2-layer Llama with hidden size 32 over the tokenizer's vocabulary, in ``dtype`` (fp32).

    ``tied``: the LM head shares the input embedding's weight (as SmolLM2 and many small models do).
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_dataset(n: int = 16, conversational: bool = False):
    """n prompts cycled from PROMPTS, as plain text or as one-turn conversations."""
    from datasets import Dataset

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    return Dataset.from_dict({"prompt": prompts})


def reward_letter_a(completions, **kwargs) -> list[float]:
    """Fraction of the completion's characters that are 'a' (varied across random completions)."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[-1]["content"]
        out.append(text.count("a") / max(len(text), 1))
    return out
