"""Test support for verl 0.9 on a machine without a GPU: a CPU platform, the recipe's config and the actor config.

verl 0.9 ships CUDA, NPU and ROCm platforms only, and its FSDP engine asks the platform for its device, its
device module and its communication backend. ``PlatformCPU`` answers "cpu", a torch.cpu-like module and "gloo",
through verl's public platform registry (``PlatformRegistry.register``, selected with ``VERL_PLATFORM=cpu``). It is
for tests: it reports no memory statistics and no FLOPs. Under Ray it names the resource "GPU", so that verl's worker
groups schedule on logical GPUs (``+ray_kwargs.ray_init.num_gpus=N``) while every tensor stays on the CPU.
"""

from __future__ import annotations

import contextlib
import types

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

# docs/verl.md's overrides of a stock verl GRPO config (tests/integrations/verl/test_verl_engine.py checks that the
# page lists them)
RECIPE = [
    "actor_rollout_ref.actor._target_=troll.integrations.verl.config.TrollFSDPActorConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=troll",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "+actor_rollout_ref.actor.troll.kl_bound=0.05",
    "+actor_rollout_ref.actor.troll.alpha=1.0",
    "+actor_rollout_ref.actor.troll.top_k=64",
    "+actor_rollout_ref.actor.troll.delta=1e-5",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.use_remove_padding=True",
]


def _cpu_device_module() -> types.ModuleType:
    """torch.cpu plus the few torch.cuda-style functions verl's engine and worker call (no-ops or zeros)."""
    module = types.ModuleType("troll_tests_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    zero = lambda *args, **kwargs: 0  # noqa: E731
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        setattr(module, name, zero)
    module.mem_get_info = lambda *args, **kwargs: (0, 0)
    module.reset_peak_memory_stats = module.empty_cache = lambda *args, **kwargs: None
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.get_rng_state, module.set_rng_state = torch.get_rng_state, torch.set_rng_state
    module.is_available = lambda: True
    module.get_device_name = lambda *args, **kwargs: "CPU"
    return module


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU, with gloo; ``current_device`` is "cpu" so ``.to(device)`` stays here."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _cpu_device_module()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return True

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"  # verl's worker groups ask Ray for one of these a process: logical GPUs (ray_init.num_gpus)

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def actor_config(mode: str, troll: dict, agg="token-mean", **extra):
    """The actor config a verl run builds from Hydra, with TROLL's section (docs/verl.md's recipe)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg = {
        "_target_": "troll.integrations.verl.config.TrollFSDPActorConfig",
        "strategy": "fsdp2",
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 2,
        "rollout_n": 1,
        "use_dynamic_bsz": False,
        "loss_agg_mode": agg,
        "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": mode},
        "troll": dict(troll),
        **extra,
    }
    return omega_conf_to_dataclass(OmegaConf.create(cfg))


def compose(overrides: list[str]):
    """verl's ppo_trainer config with ``overrides`` (Hydra's compose API, as ``main_ppo`` composes it)."""
    from pathlib import Path

    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)
