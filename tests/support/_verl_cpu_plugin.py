"""What every process of a CPU end-to-end verl run imports (``VERL_USE_EXTERNAL_MODULES=_verl_cpu_plugin``, with
tests/support on ``PYTHONPATH``); tests only.

- the CPU platform of :mod:`_verl_cpu` (selected with ``VERL_PLATFORM=cpu``);
- verl's Ray workers start their process group as ``cpu:gloo,<device>:<backend>``, which torch refuses for
  ``cpu:gloo,cpu:gloo``: the worker module's ``initialize_global_process_group_ray`` gets plain gloo;
- the transformers rollout (:mod:`_verl_hf_rollout`, ``actor_rollout_ref.rollout.name=hf``);
- a record of the trainer class that ``init_workers`` runs on, written as JSON to ``$TROLL_VERL_TRAINER_RECORD``
  when that is set (the end-to-end tests read which trainer ran in the task runner's Ray process).
"""

from __future__ import annotations

import importlib
import json
import os

import _verl_cpu  # noqa: F401  (registers the platform)
import verl.workers.engine_workers as engine_workers
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import distributed
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutReplicaRegistry

RECORD = "TROLL_VERL_TRAINER_RECORD"
ROLLOUT = "hf"  # actor_rollout_ref.rollout.name of the transformers rollout


def _gloo_process_group(timeout_second=None, backend=None):
    distributed.initialize_global_process_group_ray(timeout_second=timeout_second, backend="gloo")


def _recording(init_workers):
    def wrapper(self):
        path = os.environ.get(RECORD)
        if path:
            cls = type(self)
            with open(path, "w") as f:
                json.dump({"trainer": f"{cls.__module__}.{cls.__qualname__}", "pid": os.getpid()}, f)
        return init_workers(self)

    wrapper._troll_recording = True
    return wrapper


engine_workers.initialize_global_process_group_ray = _gloo_process_group
# by name: verl imports this module while it is itself being imported, from any process, including the rollout
# server's, whose first import is _verl_hf_rollout (which imports verl)
RolloutReplicaRegistry.register(ROLLOUT, lambda: importlib.import_module("_verl_hf_rollout").HFRolloutReplica)
rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = "_verl_hf_rollout.HFServerAdapter"
if not getattr(RayPPOTrainer.init_workers, "_troll_recording", False):
    RayPPOTrainer.init_workers = _recording(RayPPOTrainer.init_workers)
