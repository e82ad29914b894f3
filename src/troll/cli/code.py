"""``troll eval-code``: greedy pass@1 of a model on a code task or on HumanEval, scored in the sandbox.

The provider of that subcommand (see :mod:`troll.cli`); the work is :mod:`troll.train.code_eval`. Inputs are
checked before the model is loaded; nothing is written unless ``--out`` names a new file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from troll.runs.files import UsageError

DOC = (
    "Greedy pass@1 of a model on a code task: HumanEval (--task humaneval: the problems whose tests convert to "
    "call-style cases), the held-out items of a generated task (code, code_<family>), or a JSONL file "
    "(jsonl:PATH). Prints one JSON object: pass_at_1, reward (mean fraction of tests passed), per family, and the "
    "HumanEval problems left out by reason."
)


def add_commands(sub) -> None:
    p = sub.add_parser("eval-code", help="greedy pass@1 of a model on HumanEval or a code task", description=DOC)
    p.add_argument("--task", default="humaneval", help="humaneval, code, code_<family> or jsonl:PATH "
                   "(default: humaneval)")  # fmt: skip
    p.add_argument("--model", default="smollm2", help="as troll train's --model (default: smollm2)")
    p.add_argument("--n", type=int, default=None, help="items evaluated (default: all of HumanEval or the file; "
                   "128 held-out items of a generated task)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="a generated task's seed, as troll train's (default: 0)")
    p.add_argument("--max-completion-length", type=int, default=None,
                   help="new tokens a completion (default: 384 for HumanEval, 160 otherwise)")  # fmt: skip
    p.add_argument("--system", default=None, help="system message (default: the chat template's own)")
    p.add_argument("--slots", type=int, default=2, help="sandboxed processes at once (default: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--out", default=None, help="also write the result as JSON to this new file")
    p.set_defaults(run=cmd_eval_code, name="eval-code")


def _check(args: argparse.Namespace) -> int:
    from troll.runs.numbers import check_int
    from troll.train import code_data, code_eval, model

    if not code_data.is_code_task(args.task):
        raise UsageError(f"--task must be humaneval, code, code_<family> or jsonl:PATH, got {args.task!r}.")
    code_data.check_code_task(args.task, training=False)
    for flag, value in (("--n", args.n), ("--max-completion-length", args.max_completion_length)):
        if value is not None:
            check_int(flag, value, low=1, high=10**6, error=UsageError)
    check_int("--slots", args.slots, low=1, high=256, error=UsageError)
    check_int("--threads", args.threads, low=1, high=1024, error=UsageError)
    if args.out is not None and Path(args.out).exists():
        raise UsageError(f"--out {args.out} exists; troll never overwrites a result: give a new file name.")
    model.resolve_model(args.model)
    if args.max_completion_length:
        return args.max_completion_length
    return (
        code_eval.HUMANEVAL_COMPLETION_LENGTH if args.task == code_data.HUMANEVAL else code_data.CODE_COMPLETION_LENGTH
    )


def cmd_eval_code(args: argparse.Namespace) -> int:
    length = _check(args)
    import torch

    from troll.train import code_eval, model

    torch.set_num_threads(args.threads)
    net, tokenizer = model.load_model(model.resolve_model(args.model))
    result = code_eval.evaluate(net, tokenizer, args.task, n=args.n, seed=args.seed, max_new_tokens=length,
                                system=args.system, slots=args.slots)  # fmt: skip
    data = {**result.to_json(), "model": args.model, "max_completion_length": length}
    text = json.dumps(data, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if result.unscored:
        print(f"troll eval-code: the sandbox could not run {result.unscored} item(s); counted as failures",
              file=sys.stderr)  # fmt: skip
    return 0
