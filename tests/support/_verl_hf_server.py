"""The generation side of the transformers rollout (:mod:`_verl_hf_rollout`; tests only): a Ray actor that answers
verl's token-in-token-out ``generate`` requests with a Hugging Face causal LM in fp32 (sdpa attention, one thread).

It imports neither verl nor Ray, so its process starts with torch and transformers alone (verl's own import costs
seconds a process). It samples one token at a time with the KV cache from the softmax of the logits / temperature
(temperature 0: greedy; no top-k or top-p) and returns each sampled token's log-prob under that distribution, the one
verl's actor recomputes as ``old_log_probs``. The answer has the fields of verl's ``TokenOutput`` that the agent loop
reads.
"""

from __future__ import annotations

import types

import torch


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (named actors are per job, so runs on one cluster never meet)."""
    return f"troll_hf_rollout_server_{replica_rank}"


class HFRolloutServer:
    """One replica's generation: a Hugging Face causal LM in fp32 with sdpa attention, on the CPU, one thread."""

    def __init__(self, path: str, seed: int, prompt_length: int, response_length: int):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.prompt_length, self.response_length = prompt_length, response_length
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.generator = torch.Generator().manual_seed(seed)
        self.weight_updates = 0

    def load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Load the actor's full weights (every parameter and buffer of the model must be named)."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        missing = sorted(name for name in own if name not in state and not name.endswith("rotary_emb.inv_freq"))
        if unknown or missing:
            raise KeyError(f"HFRolloutServer.load_weights: unknown {unknown[:5]}, missing {missing[:5]}")
        self.model.load_state_dict(state, strict=False)
        self.weight_updates += 1
        return self.weight_updates

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], max_tokens: int, params: dict) -> tuple[list[int], list[float]]:
        temperature = float(params.get("temperature", 1.0))
        if int(params.get("top_k", -1)) > 0 or float(params.get("top_p", 1.0)) < 1.0:
            raise NotImplementedError("HFRolloutServer samples the whole distribution: set rollout.top_k=-1, top_p=1")
        out = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        tokens, logps = [], []
        for _ in range(max_tokens):
            logits = out.logits[0, -1].float()
            logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, -1)
            if temperature > 0:
                token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            else:
                token = int(logp.argmax())
            tokens.append(token)
            logps.append(float(logp[token]))
            if token in self.eos:
                break
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        return tokens, logps

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **kwargs):
        """verl's token-in-token-out request (``vLLMHttpServer.generate``'s arguments) -> ``TokenOutput``."""
        if image_data is not None or video_data is not None:
            raise NotImplementedError("HFRolloutServer: text only")
        params = dict(sampling_params)
        room = self.prompt_length + self.response_length - len(prompt_ids)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        max_tokens = min(self.response_length, room) if max_tokens is None else max_tokens
        tokens, logps = self._sample(list(prompt_ids), max(1, int(max_tokens)), params)
        return types.SimpleNamespace(
            token_ids=tokens,
            log_probs=logps if params.get("logprobs") else None,
            routed_experts=None,
            stop_reason="completed",
            num_preempted=None,
            extra_fields={},
        )

    # verl's replica controls, which a server without sleep mode or a KV cache to free answers at once
    async def wake_up(self, tags=None):
        pass

    async def sleep(self):
        pass

    async def clear_kv_cache(self):
        pass

    async def set_global_steps(self, global_steps):
        pass
