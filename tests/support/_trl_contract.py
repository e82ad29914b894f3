"""What the TRL contract tests (tests/integrations/trl/test_trl_contract.py,
tests/integrations/trl/test_trl_contract_behaviour.py) share: the "TRL changed ..." failure message, the module-scoped
fixtures (one thread, the tiny TrollGRPOTrainer ``tr`` and TRL's scored batch ``scored``), and a spy on TRL's own
log-prob method.

A test module uses the fixtures by importing them (``from _trl_contract import one_thread, scored_fixture,
tr_fixture``); the functions carry a suffix so that a test's ``tr`` or ``scored`` argument does not shadow an import.
Being module-scoped, they are built once for each module that requests them.
"""

from __future__ import annotations

import os
from unittest.mock import patch

import pytest
import torch

pytest.importorskip("trl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiny import PROMPTS, reward_letter_a, tiny_dataset, tiny_model, tiny_tokenizer  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from troll.integrations.trl import TrollGRPOConfig, TrollGRPOTrainer  # noqa: E402


def changed(what: str, detail: str) -> str:
    return f"TRL changed {what}: {detail}; see docs/trl.md, 'Upgrading TRL'"


def report(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: intra-op threads only add contention on these shapes
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", name="tr")
def tr_fixture(tmp_path_factory):
    """One tiny trainer: the TROLL loss type, two optimiser steps per rollout batch (TRL computes old log-probs),
    a sampling temperature other than 1 (so that dividing by it is checked)."""
    kwargs = dict(
        output_dir=str(tmp_path_factory.mktemp("contract")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        steps_per_generation=2,
        temperature=0.7,
        max_steps=1,
        learning_rate=1e-2,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    tok = tiny_tokenizer()
    try:
        args = TrollGRPOConfig(**kwargs)
        with patch("troll.integrations.trl.trainer.check_trl_version"):  # say what changed, not only the version
            trainer = TrollGRPOTrainer(
                model=tiny_model(tok),
                reward_funcs=reward_letter_a,
                args=args,
                train_dataset=tiny_dataset(),
                processing_class=tok,
            )
    except Exception as err:  # every test below needs it: say so once, in the contract's words
        pytest.fail(changed("GRPOTrainer.__init__ or GRPOConfig", f"building the tiny TrollGRPOTrainer raised {err!r}"))
    trainer.model.train()
    return trainer


def rollout_rows(tr, groups: int = 2) -> list[dict]:
    return [{"prompt": p} for p in PROMPTS[:groups] for _ in range(tr.num_generations)] * tr.args.steps_per_generation


class Spy:
    """Records each call of TRL's own _get_per_token_logps_and_entropies made through the trainer instance."""

    def __init__(self, tr):
        self.tr, self.calls = tr, []

    def __call__(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = GRPOTrainer._get_per_token_logps_and_entropies(
            self.tr, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        grad = torch.is_grad_enabled()
        self.calls.append(dict(model=model, ids=input_ids, mask=attention_mask, t=logits_to_keep, grad=grad, out=out))
        self.calls[-1].update(kwargs)
        return out

    def score(self, rows):
        """TRL's own _generate_and_score_completions (not the trainer's override), with this spy installed."""
        with patch.object(self.tr, "_get_per_token_logps_and_entropies", self):
            return GRPOTrainer._generate_and_score_completions(self.tr, rows)


@pytest.fixture(scope="module", name="scored")
def scored_fixture(tr):
    """TRL's scored rollout batch (16 rows) and the log-prob calls TRL made while scoring it."""
    spy = Spy(tr)
    try:
        return spy.score(rollout_rows(tr)), spy.calls
    except Exception as err:
        pytest.fail(changed("GRPOTrainer._generate_and_score_completions", f"scoring 16 rollouts raised {err!r}"))
