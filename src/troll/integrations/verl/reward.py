"""verl's custom reward function for code: ``compute_score`` runs a response's program on its tests in the sandbox.

Point verl 0.9's trainer at it (no verl file changed)::

    reward.custom_reward_function.path=<site-packages>/troll/integrations/verl/reward.py
    reward.custom_reward_function.name=compute_score

with each row's ``reward_model.ground_truth`` the tests as a JSON string, in troll's form or the APPS/Eurus form
``{"inputs", "outputs"[, "fn_name"]}`` (:mod:`troll.integrations.code_reward`). verl 0.9.1's trainer scores through
its reward loop, one response a call (``reward.reward_manager.name=naive``, the default); ``compute_score_batch`` is
the form of verl's older batch reward manager (``verl.workers.reward_manager``, ``batch``), which verl 0.9.1's
trainer no longer calls. The score is a dict, as verl's reward managers accept: ``score`` (the fraction of the first
10 tests passed, verl's reward), ``acc`` (1.0 when all passed) and ``scored`` (0.0 where the sandbox itself failed:
that response gets score 0, and ``scored`` tells such rows from code that failed). Needs no verl to import.
"""

from __future__ import annotations

from typing import Any

from troll.integrations.code_reward import MAX_TESTS, OUTPUT, score


def _as_dict(result) -> dict[str, float]:
    if result is None:
        return {"score": 0.0, "acc": 0.0, "scored": 0.0}
    return {"score": float(result.reward), "acc": float(result.all_passed), "scored": 1.0}


def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None, extra_info: Any = None,
                  output: int = OUTPUT, **kwargs) -> dict[str, float]:  # fmt: skip
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` for one response."""
    return _as_dict(score([solution_str], [ground_truth], max_tests=MAX_TESTS, output=output)[0])


def compute_score_batch(data_sources: list, solution_strs: list[str], ground_truths: list, extra_infos=None,
                        output: int = OUTPUT, **kwargs) -> list[dict[str, float]]:  # fmt: skip
    """verl's batch form (``reward_model.reward_manager=batch``): every response at once, the sandbox's slots in
    parallel and identical ones scored once."""
    results = score(list(solution_strs), list(ground_truths), max_tests=MAX_TESTS, output=output)
    return [_as_dict(r) for r in results]
