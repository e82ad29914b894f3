"""TROLL in TRL's GRPOTrainer: ``loss_type="troll"`` and ``"troll_seq"`` next to TRL's own loss types.

``from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer`` (``pip install troll[trl]``): the config
(:mod:`troll.integrations.trl.config`) and the trainer (:mod:`troll.integrations.trl.trainer`, whose docstring says how
the TROLL loss types depart from TRL's clipped objective). docs/trl.md has the details and the upgrade procedure.
``CodeReward`` (:mod:`troll.integrations.code_reward`) is a reward function for code: the fraction of a dataset row's
tests the completion's program passes in the sandbox.
"""

from troll.integrations.code_reward import CodeReward
from troll.integrations.trl.config import SUPPORTED_TRL, TRL_LOSS_TYPES, TrollGRPOConfig, check_trl_version
from troll.integrations.trl.trainer import TrollGRPOTrainer

__all__ = ["CodeReward", "SUPPORTED_TRL", "TRL_LOSS_TYPES", "TrollGRPOConfig", "TrollGRPOTrainer", "check_trl_version"]
