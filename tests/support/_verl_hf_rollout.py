"""A transformers rollout for verl 0.9 on CPU (tests only): verl's rollout server interface over a Hugging Face model.

verl 0.9.1 generates only through its async rollout servers (vLLM, SGLang, TensorRT-LLM; none runs here), so the
end-to-end tests register a fourth backend, ``actor_rollout_ref.rollout.name=hf``, through verl's two registries
(:mod:`_verl_cpu_plugin` registers it, by name, so that importing this module never runs before verl is imported):

- :class:`HFRolloutReplica` (``RolloutReplicaRegistry``): the trainer's process starts one
  :class:`_verl_hf_server.HFRolloutServer` Ray actor a replica, the handle verl's agent loop sends its
  token-in-token-out ``generate`` requests to;
- :class:`HFServerAdapter` (``_ROLLOUT_REGISTRY``): built by verl's hybrid worker next to its FSDP engine; verl's
  weight sync hands it the actor's full tensors, which it sends to its replica's server.

fp32 and one replica per trainer process (``tensor_model_parallel_size=1``): no sleep mode, no KV-cache release, no
multi-modal input.
"""

from __future__ import annotations

import os

import ray
import torch
from _verl_hf_server import HFRolloutServer, server_name
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplica


class HFRolloutReplica(RolloutReplica):
    """A replica of :class:`HFRolloutServer`: one server actor, next to the replica's trainer process."""

    async def launch_servers(self):
        if self.world_size != 1:
            raise ValueError("the hf rollout runs one process a replica: set rollout.tensor_model_parallel_size=1")
        server = (
            ray.remote(HFRolloutServer)
            .options(name=server_name(self.replica_rank), num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                path=self.model_config.get("local_path") or self.model_config.path,  # verl hands it the Hydra node
                seed=int(self.config.seed) + self.replica_rank,
                prompt_length=self.config.prompt_length,
                response_length=self.config.response_length,
            )
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-rollout-{self.replica_rank}"  # a key for verl's load balancer, not a URL


class HFServerAdapter(rollout_base.BaseRollout):
    """The hybrid worker's side: sends the actor's weights to its replica's server after each update."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        self.replica_rank = rank if replica_rank == -1 else replica_rank  # one process a replica
        self.is_leader_rank = True

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"HFServerAdapter: wire_format={wire_format!r}")
        # every rank walks the generator: under FSDP2 each full tensor is an all-gather of the shards
        state = {name: tensor.detach().to("cpu", torch.float32).clone() for name, tensor in weights}
        server = ray.get_actor(server_name(self.replica_rank))
        await server.load_weights.remote(state)

    async def resume(self, tags):
        pass

    async def release(self):
        pass
