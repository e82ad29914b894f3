"""The reward of the CPU end-to-end verl runs (verl's ``naive`` reward manager, one response a call; tests only).

Rows whose data source is "code" get troll's code reward for verl (:func:`troll.integrations.verl.reward.
compute_score`: the response's program run on the row's tests in the sandbox). A tiny random model writes no program
that passes, so those rows score 0 and give GRPO nothing to learn from; the other rows score the fraction of the
response's characters that are "a", which varies between samples, so that the update has advantages.
"""

from __future__ import annotations

from troll.integrations.verl import reward


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None, **kwargs):
    if data_source == "code":
        return reward.compute_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": solution_str.count("a") / max(len(solution_str), 1), "acc": 0.0, "scored": 1.0}
