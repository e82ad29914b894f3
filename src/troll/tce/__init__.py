"""The ``troll tce`` application: its command line (``cli``, ``flags``), one run into a run folder (``run``, and
stable-baselines3's PPO in ``ppo``), its study frontend (``study``, ``archive``, ``status``), the report over studies
(``results``), a run's summary (``report``) and videos (``render``). It stands on the episodic library,
:mod:`troll.episodic`, as :mod:`troll.lm` stands on :mod:`troll.integrations` (docs/architecture.md). The package
imports nothing at import time, so that ``troll --help`` loads no torch through it.
"""
