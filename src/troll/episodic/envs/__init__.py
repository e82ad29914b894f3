"""Episodic environments for TCE: reset E episodes with a context, run one desired trajectory per episode, get
every step's states, rewards and dones back (base.py has the interface, registry.py the names).

    from troll.episodic.envs import make_env
    with make_env("metaworld/reach-v3", num_episodes=16, workers=2) as env:
        start = env.reset(seed=0)              # context (E, C), pos (E, D), vel (E, D)
        episodes = env.run(pos_d, vel_d)       # desired (E, T+1, D) at t_k = k * env.dt
"""

from troll.episodic.envs.base import Episodes, EpisodeStart, EpisodicEnv, NonFiniteError
from troll.episodic.envs.registry import ENV_NAMES, make_env, register
from troll.episodic.envs.workers import EnvWorkerError

__all__ = [
    "ENV_NAMES",
    "EnvWorkerError",
    "EpisodeStart",
    "Episodes",
    "EpisodicEnv",
    "NonFiniteError",
    "make_env",
    "register",
]
