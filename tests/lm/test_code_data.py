"""The user's JSONL of prompts and tests (both styles, the APPS/Eurus forms, errors naming line and field) and the
HumanEval conversion (what converts, what is left out and why)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from troll.lm import code_data, humaneval, tasks
from troll.lm.options import UsageError

CALL = {"kind": "call", "entry_point": "add", "cases": [{"input": [1, 2], "expected": 3}]}
STDIO = {"kind": "stdio", "cases": [{"input": "1 2\n", "expected": "3\n"}]}


def _write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return f"jsonl:{path}"


def test_jsonl_reads_both_styles_and_the_apps_and_eurus_forms(tmp_path):
    apps = {
        "question": "Add them.",
        "input_output": json.dumps({"inputs": [[1, 2]], "outputs": [[3]], "fn_name": "add"}),
    }
    eurus = {
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Read and add."}],
        "reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}), "style": "rule"},
    }
    lines = [{"prompt": "Write add.", "tests": CALL}, "", {"prompt": "Sum.", "tests": STDIO}, apps, eurus]
    name = _write(tmp_path / "t.jsonl", lines)
    rows = code_data.read_jsonl(tmp_path / "t.jsonl")
    assert [r["question"] for r in rows] == ["Write add.", "Sum.", "Add them.", "Read and add."]
    assert rows[0]["tests"] == CALL and rows[1]["tests"] == {**STDIO, "entry_point": None}
    assert rows[2]["tests"] == CALL  # APPS wraps a call's result in a list: unwrapped
    assert rows[3]["tests"] == {**STDIO, "entry_point": None}
    task = tasks.build_task(name, seed=5, n_train=0, n_heldout=1, system=None)
    assert len(task.heldout) == 1 and len(task.train) == 3 and task.train_indices == [0, 1, 2]
    assert task.heldout == tasks.build_task(name, seed=6, n_train=0, n_heldout=1, system=None).heldout  # fixed split


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("{not json", "not valid JSON"),
        ({"tests": CALL}, "field prompt"),
        ({"prompt": "p"}, "field tests"),
        ({"prompt": "p", "tests": {**CALL, "kind": "exec"}}, "tests.kind"),
        ({"prompt": "p", "tests": {**CALL, "entry_point": "not a name"}}, "tests.entry_point"),
        ({"prompt": "p", "tests": {**CALL, "cases": []}}, "tests.cases"),
        ({"prompt": "p", "tests": {**CALL, "cases": [{"input": 1, "expected": 2}]}}, r"tests.cases\[0\].input"),
        ({"prompt": "p", "tests": {**STDIO, "cases": [{"input": "1", "expected": 3}]}}, r"tests.cases\[0\].expected"),
        ({"prompt": "p", "input_output": '{"inputs": ["1"], "outputs": []}'}, "input_output.outputs"),
        ({"prompt": "p", "tests": "{"}, "tests: not valid JSON"),
    ],
)
def test_a_malformed_line_names_its_number_and_field(tmp_path, line, field):
    name = _write(tmp_path / "bad.jsonl", [{"prompt": "fine", "tests": CALL}, line])
    with pytest.raises(UsageError, match=rf"line 2: .*{field}"):
        tasks.check_task(name)


def test_train_refuses_a_bad_jsonl_before_it_loads_or_writes(tmp_path, capsys):
    name = _write(tmp_path / "bad.jsonl", [{"prompt": "fine", "tests": CALL}, {"prompt": "p"}])
    out = tmp_path / "run"
    code, err = run_cli(capsys, "train", "--task", name, "--out", str(out), "--model", str(tmp_path / "no-model"))
    assert code == 2 and "line 2: field tests" in err and not out.exists()
    code, err = run_cli(capsys, "train", "--task", _write(tmp_path / "one.jsonl", [{"prompt": "p", "tests": CALL}]),
                        "--out", str(out))  # fmt: skip
    assert code == 2 and "--heldout 1 leaves no training item" in err and not out.exists()
    code, err = run_cli(capsys, "train", "--task", f"jsonl:{tmp_path / 'missing.jsonl'}", "--out", str(out))
    assert code == 2 and "no such file" in err


def test_humaneval_converts_the_literal_asserts_and_counts_the_rest():
    items, skipped = humaneval.items()
    assert len(items) + sum(skipped.values()) == 164
    assert len(items) == 141
    assert dict(skipped) == {"other statement": 12, "not a literal": 7, "tolerance": 2, "not JSON": 2}
    first = items[0]
    assert first["task_id"] == "HumanEval/0" and first["tests"]["entry_point"] == "has_close_elements"
    assert first["tests"]["cases"][0] == {"input": [[1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3], "expected": True}
    assert len(first["tests"]["cases"]) == 7 and "def has_close_elements" in first["question"]


@pytest.mark.parametrize(
    ("body", "result"),
    [
        (
            "    assert candidate(1, 'a') == [1, (2, 3)], 'msg'\n    assert True\n",
            [{"input": [1, "a"], "expected": [1, [2, 3]]}],
        ),
        (
            "    assert 4 == candidate([2])\n    assert candidate(0) is False\n",
            [{"input": [[2]], "expected": 4}, {"input": [0], "expected": False}],
        ),
        ("    assert abs(candidate(1.5) - 0.5) < 1e-6\n", "tolerance"),
        ("    for x in range(3):\n        assert candidate(x) == x\n", "other statement"),
        ("    assert candidate(len('ab')) == 2\n", "not a literal"),
        ("    assert candidate((1, 2)) == 3\n", "not JSON"),
        ("    assert candidate(1) == float('inf')\n", "not a literal"),
        ("    assert candidate(1) is None\n", "other statement"),
    ],
)
def test_humaneval_conversion_rules(body, result):
    problem = {"test": f"def check(candidate):\n{body}", "entry_point": "f"}
    if isinstance(result, str):
        with pytest.raises(humaneval.Skip, match=result):
            humaneval.convert(problem)
    else:
        assert humaneval.convert(problem) == {"kind": "call", "entry_point": "f", "cases": result}


def test_eval_code_checks_its_flags(tmp_path, capsys):
    assert run_cli(capsys, "eval-code", "--task", "chain_sum")[0] == 2
    code, err = run_cli(capsys, "eval-code", "--task", "code", "--n", "0")
    assert code == 2 and "--n" in err
    (tmp_path / "r.json").write_text("{}")
    code, err = run_cli(capsys, "eval-code", "--out", str(tmp_path / "r.json"))
    assert code == 2 and "never overwrites" in err


def test_humaneval_canonical_solutions_pass_their_converted_tests():
    from troll.lm import code_eval

    problems = {p["task_id"]: p for p in humaneval.load_problems()}
    rows = humaneval.items()[0][::7]  # 21 of the 141, spread over the set
    # the model's block holds only the function, as a chat model writes it; imports and helpers come from the prompt
    answers = [f"```python\n{_function_only(problems[r['task_id']])}```" for r in rows]
    result = code_eval.score_rows("humaneval", rows, answers, {})
    assert result.unscored == 0 and result.pass_at_1 == 1.0, result.samples
    wrong = code_eval.score_rows("humaneval", rows[:2], ["```python\ndef nothing():\n    pass\n```"] * 2, {})
    assert wrong.pass_at_1 == 0.0


def _function_only(problem: dict) -> str:
    """The problem's entry-point function (its stub from the prompt with the canonical body), without the imports."""
    prompt = problem["prompt"]
    start = prompt.index(f"def {problem['entry_point']}(")
    return prompt[start:] + problem["canonical_solution"]


def test_eval_code_prints_pass_at_1(tmp_path, capsys, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TROLL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    code = run_cli(capsys, "eval-code", "--task", "code_list", "--n", "2", "--model", str(tiny_model_dir),
                   "--max-completion-length", "4", "--out", str(out))[0]  # fmt: skip
    result = json.loads(out.read_text())
    assert code == 0 and result["n"] == 2 and result["pass_at_1"] == 0.0 and result["by_family"]["list"]["n"] == 2
    assert result["sampled"] == {"pass@1": 0.0, "pass@4": 0.0}  # 4 samples an item at 0.7 by default
    assert (result["samples_per_item"], result["temperature"]) == (4, 0.7)


def test_eval_code_pass_rates_from_known_completions(monkeypatch):
    """pass@1 greedy and the sampled pass@k computed from completions whose scores are known: item 0's reference
    function passes, item 1's is wrong; the samples: item 0 right in 2 of 4, item 1 in 0 of 4."""
    from troll.lm import code_eval, code_tasks, evaluate

    rows = code_tasks.items("code_affine", seed=3, size=2)
    rows[1] = {**rows[1], "tests": {**rows[1]["tests"], "entry_point": "other"}}  # a second function asked for
    right = "```python\n" + _reference(rows[0]) + "```"
    wrong = "```python\ndef nothing():\n    pass\n```"

    def fake_generate(model, tokenizer, texts, *, max_new_tokens, samples=0, **kwargs):
        if not samples:
            return [[right], [wrong]][: len(texts)], [[False]] * len(texts)
        return [[right, wrong, right, wrong], [wrong] * 4][: len(texts)], [[False] * 4] * len(texts)

    monkeypatch.setattr(evaluate, "generate", fake_generate)
    monkeypatch.setattr(code_eval, "eval_items", lambda task, n, seed: (rows, {}))
    monkeypatch.setattr(evaluate, "prompt_texts", lambda tokenizer, questions, system: questions)
    result = code_eval.evaluate(None, None, "code_affine", n=2, seed=0, max_new_tokens=8, samples=4, bar=False)
    assert result.pass_at_1 == 0.5
    # pass@1 = mean(2/4, 0/4); pass@4 = mean(1 - C(2,4)/C(4,4), 0) = mean(1, 0)
    assert result.sampled == {"pass@1": 0.25, "pass@4": 0.5}
    assert (result.cut, result.prose_first) == (0.0, 0.0)  # both greedy answers open with their fence
    name = rows[0]["tests"]["entry_point"]
    assert result.by_function == {
        name: {"pass_at_1": 1.0, "n": 1, "family": "affine", "sampled": {"pass@1": 0.5, "pass@4": 1.0}},
        "other": {"pass_at_1": 0.0, "n": 1, "family": "affine", "sampled": {"pass@1": 0.0, "pass@4": 0.0}},
    }


def _reference(row: dict) -> str:
    """A correct function for a generated affine item, from its own test cases (two points fix a line)."""
    (x0,), y0 = row["tests"]["cases"][0]["input"], row["tests"]["cases"][0]["expected"]
    (x1,), y1 = row["tests"]["cases"][1]["input"], row["tests"]["cases"][1]["expected"]
    a = (y1 - y0) // (x1 - x0)
    return f"def {row['tests']['entry_point']}(x):\n    return {a} * x + {y0 - a * x0}\n"
