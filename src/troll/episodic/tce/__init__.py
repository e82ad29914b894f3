"""The episodic library the ``troll tce`` application stands on: ProDMP trajectories (``prodmp``), the agent's
settings and presets (``config``), the context policy over the primitive's weights (``policy``), the critic and its
normaliser (``critic``, ``normalize``), the segments of TCE's per-segment advantages (``segments``) and the update
that calls :func:`troll.gaussian.trpl_loss` (``agent``). It imports the environments' interface
(:mod:`troll.episodic.envs`) and the Gaussian wing, never the application around it (docs/architecture.md).
"""
