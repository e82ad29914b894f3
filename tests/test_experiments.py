"""The scripts of experiments/: experiments/stale_rollouts.py makes valid options for every setting its flags allow
(the model, the training and the evaluation are stood in for: a real run takes minutes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
pytest.importorskip("reasoning_gym")

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "stale_rollouts.py"


def test_stale_rollouts_accuracy_before_takes_the_runs_batch_shape(monkeypatch):
    """--generations reaches the options of the accuracy before training as it reaches the runs': with --prompts 1
    --generations 6 --steps-per-rollout 3 (a rollout of 6 completions, 2 per step) the options are valid, not the
    default 4 generations, which 3 steps cannot share."""
    from troll.lm import evaluate, model, run

    spec = importlib.util.spec_from_file_location("stale_rollouts", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen = []
    monkeypatch.setattr(model, "resolve_model", lambda name: name)
    monkeypatch.setattr(model, "load_model", lambda ref: (None, None))
    monkeypatch.setattr(run, "_build_task", lambda opts: seen.append(opts))
    monkeypatch.setattr(evaluate, "heldout_accuracy", lambda *a, **k: SimpleNamespace(accuracy=0.5))
    args = SimpleNamespace(task="chain_sum", steps=6, steps_per_rollout=3, prompts=1, generations=6, heldout=4,
                           system=None, max_len=8)  # fmt: skip
    assert script.before_accuracy(0, args) == 0.5
    assert (seen[0].prompts_per_step, seen[0].generations, seen[0].steps_per_rollout) == (1, 6, 3)


def test_tce_endings_box_pushing_worked_by_hand():
    """experiments/tce_endings.py on box pushing: four episodes built by hand (the box's path to a goal at the origin,
    the env's final distance, rotation and success flag), each share and median worked by hand; flags that do not
    follow the success rule stop the script."""
    import torch

    spec = importlib.util.spec_from_file_location("tce_endings", SCRIPT.with_name("tce_endings.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # after each of 2 steps, the box's distance to the goal: ep 0 and 1 end at 4 cm, 2 stays at 20 cm, 3 passes 3 cm
    paths = [[0.10, 0.04], [0.10, 0.04], [0.20, 0.20], [0.03, 0.20]]
    rotation = [0.3, 0.7, 0.2, 1.0]  # rad: ep 0 the only success (4 cm and 0.3 rad)
    states = torch.zeros(4, 3, 28)
    states[:, 0, 14] = 0.5
    states[:, 1:, 14] = torch.tensor(paths)  # the box's x; the goal (entries 21-23) at the origin
    distance = torch.tensor([p[-1] for p in paths])
    ep = SimpleNamespace(states=states, success=torch.tensor([1.0, 0.0, 0.0, 0.0]),
                         final={"distance": distance, "rotation": torch.tensor(rotation)})  # fmt: skip
    got = script.play_box(7, [(ep, None, None)])
    assert got["checkpoint iteration"] == 7 and got["episodes"] == 4
    assert got["success after the last step"] == 0.25
    assert (got["within 5 cm at the end"], got["within 0.5 rad at the end"]) == (0.5, 0.5)
    assert (got["within 5 cm, not within 0.5 rad"], got["within 0.5 rad, not within 5 cm"]) == (0.25, 0.25)
    assert got["within 5 cm at some step"] == 0.75  # ep 3 came to 3 cm and left
    assert got["end distance, all (median, cm)"] == pytest.approx(12.0)  # (4 + 20) / 2
    assert got["end rotation, all (median, rad)"] == pytest.approx(0.5)  # (0.3 + 0.7) / 2
    assert got["end rotation, within 5 cm (median, rad)"] == pytest.approx(0.5)
    ep.success = torch.tensor([0.0, 0.0, 0.0, 0.0])
    with pytest.raises(SystemExit, match="do not follow its rule"):
        script.play_box(7, [(ep, None, None)])


def test_tables_print_counts_whole():
    """The tables of tce_endings.py and tce_exploration.py print counts as integers (1316 iterations, not 1.32e+03),
    other numbers to 3 significant digits, a missing one as '-'."""
    for name, missing in (("tce_endings", float("nan")), ("tce_exploration", None)):
        spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        assert [script.cell(v) for v in (1316, 0.12345, 1316.0, missing)] == ["1316", "0.123", "1.32e+03", "-"]


def test_code_recipe_table_worked_by_hand(tmp_path, capsys):
    """experiments/code_recipe.py: a run folder built by hand (evaluations at steps 0 and 4, rewards 0.1 to 0.4 over
    four steps: the last quarter is the last step's 0.4) and an eval-code result give the rows worked out here."""
    import json

    spec = importlib.util.spec_from_file_location("code_recipe", SCRIPT.parent / "code_recipe.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    run = tmp_path / "r1"
    run.mkdir()
    options = {"loss": "clip", "lr": 1e-5, "temperature": 0.7, "prompts_per_step": 4, "generations": 4,
               "steps_per_rollout": 2, "heldout": 64, "steps": 8}  # fmt: skip
    (run / "config.json").write_text(json.dumps({"options": options}))
    rows = [{"step": 0, "heldout/accuracy": 0.5},
            *({"step": s, "reward": s / 10, "completions/mean_length": 60 + s, "completions/clipped_ratio": s % 2 / 2,
               "entropy": 0.2 * s, "clip_ratio/region_mean": 0.001 * s}
              for s in range(1, 5)),
            {"step": 1, "frac_reward_zero_std": 0.25}, {"step": 3, "frac_reward_zero_std": 0.5},
            {"step": 4, "heldout/accuracy": 0.375, "heldout/cut": 0.25, "heldout/prose_first": 0.5}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = tmp_path / "base.json"
    result.write_text(json.dumps({"model": "smollm2", "n": 64, "pass_at_1": 0.5, "temperature": 0.7, "cut": 0.0,
                                  "prose_first": 0.125, "sampled": {"pass@1": 0.25, "pass@4": 0.6}}))  # fmt: skip
    assert script.main([str(run), "--evals", str(result)]) == 0
    out = capsys.readouterr().out
    # lengths 61 -> 64; cut shares 0.5, 0, 0.5, 0: mean 0.25
    assert (
        "| r1 | clip | fraction | 1e-05 | 0.7 | 4 x 4 | 2 | 64 | 4/8 | 0: 0.500, 4: 0.375 | -0.125 | 0.400 | "
        "61 -> 64 | 0.250 |" in out
    )
    # rewards 0.1 first, mean 0.25; groups without signal 0.25 and 0.5: 0.375; entropy mean 0.2 * 2.5 = 0.5;
    # clipped mean 0.001 * 2.5
    assert "| r1 | 0.100 / 0.250 | 0.375 | 0.500 | 0.0025 |" in out
    assert "| base | smollm2 | 64 | 0.500 | 0.250 | 0.600 | 0.7 | 0.000 | 0.125 |" in out
    assert script.run_row(run)["cut"] == 0.25 and script.run_row(run)["prose_first"] == 0.5
    # three seeds gaining 0.1, 0.2, 0.3: mean 0.2, standard error sqrt(0.01 / 3) = 0.057735, t(0.975, 2) = 4.3027:
    # the interval 0.2 -/+ 0.248414
    seeds = [{"run": f"s{k}", "accuracy": {0: 0.5, 24: 0.5 + g}} for k, g in enumerate((0.1, 0.2, 0.3))]
    table = script.gain_table(seeds)
    assert "| 3 | s0: +0.100, s1: +0.200, s2: +0.300 | 0.200 | [-0.048, +0.448] | 3 |" in table


def test_code_results_tables_worked_by_hand(tmp_path, capsys):
    """experiments/code_results.py on a study folder built by hand: troll and clip on seeds 0 and 1, evaluated at
    steps 0, 6 and 12, and HumanEval results; every number below is worked out from these."""
    import json

    spec = importlib.util.spec_from_file_location("code_results", SCRIPT.parent / "code_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    curves = {("troll", 0): (0.5, 0.75, 0.75), ("troll", 1): (0.5, 0.5, 0.625),
              ("clip", 0): (0.5, 0.625, 0.75), ("clip", 1): (0.5, 0.5, 0.5)}  # fmt: skip
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "config.json").write_text("{}")
    for (loss, seed), accs in curves.items():
        cell = tmp_path / "recipe" / loss / f"seed{seed}"
        cell.mkdir(parents=True)
        rows = [{"step": s, "heldout/accuracy": a} for s, a in zip((0, 6, 12), accs)] + [{"step": 12, "reward": 1.0}]
        (cell / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (cell / "summary.json").write_text("{}")
    unfinished = tmp_path / "recipe" / "troll" / "seed2"  # no summary: left out
    unfinished.mkdir()
    (unfinished / "metrics.jsonl").write_text(json.dumps({"step": 0, "heldout/accuracy": 0.0}) + "\n")
    (tmp_path / "humaneval").mkdir()
    for name, solved in {"base": 7, "troll-seed0": 10, "troll-seed1": 9, "clip-seed0": 11, "clip-seed1": 8}.items():
        (tmp_path / "humaneval" / f"{name}.json").write_text(json.dumps({"n": 141, "pass_at_1": solved / 141}))
    family = tmp_path / "except-string" / "clip" / "seed0"
    family.mkdir(parents=True)
    rows = [{"step": 0, "heldout/accuracy": 0.5}, {"step": 24, "heldout/accuracy": 0.75}]
    (family / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (family / "summary.json").write_text("{}")
    (tmp_path / "heldout-family").mkdir()
    by_function = {"base": {"prefix": 0.5, "repeat_text": 0.0}, "clip-seed0": {"prefix": 0.25, "repeat_text": 1.0}}
    for name, solved in {"base": 16, "clip-seed0": 24}.items():
        functions = {f: {"pass_at_1": p, "n": 8, "family": "string"} for f, p in by_function[name].items()}
        if name == "base":
            functions["prefix"]["sampled"] = {"pass@1": 0.375, "pass@4": 0.75}
        result = {"n": 64, "pass_at_1": solved / 64, "by_function": functions}
        if name == "base":
            result |= {"sampled": {"pass@1": 0.125, "pass@4": 0.375}, "temperature": 0.7}
        (tmp_path / "heldout-family" / f"{name}.json").write_text(json.dumps(result))
    assert script.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| clip-seed0 | 0.500 -> 0.750 |" in out  # the run without the family, on its own held-out items
    assert "| base | 64 | 0.250 | 16 | 0.125 (T 0.7) | 0.375 (T 0.7) |" in out  # string items
    assert "| clip-seed0 | 64 | 0.375 | 24 | - | - |" in out
    # by function, 8 items each: prefix 4 -> 2 solved, repeat_text 0 -> 8
    assert "| `prefix` | 8 | 4 / 0.38 | 2 |" in out and "| `repeat_text` | 8 | 0 | 8 |" in out
    # means over the two seeds: troll 0.5, 0.625, 0.6875; clip 0.5, 0.5625, 0.625
    assert "| troll | 2 | 0.500 | 0.625 | 0.688 |" in out and "| clip | 2 | 0.500 | 0.562 | 0.625 |" in out
    # gains 0.25 and 0.125: mean 0.1875, se 0.0625, t(0.975, 1) = 12.706: half-width 0.794
    assert "| troll | 0: +0.250, 1: +0.125 | +0.188 | [-0.607, +0.982] | 2 |" in out
    # clip gains 0.25 and 0: mean 0.125, se 0.125, half-width 1.588
    assert "| clip | 0: +0.250, 1: +0.000 | +0.125 | [-1.463, +1.713] | 2 |" in out
    # step 6: +0.125, 0; step 12: 0, +0.125 (mean 0.0625, se 0.0625)
    assert "| 6 | 0: +0.125, 1: +0.000 | +0.062 | [-0.732, +0.857] | 2 |" in out
    assert "| 12 | 0: +0.000, 1: +0.125 | +0.062 | [-0.732, +0.857] | 2 |" in out
    # clip's final 0.75 on seed 0: troll has it at step 6; 0.5 on seed 1: troll has it at step 6 too. Base + 0.1 =
    # 0.6: on seed 0 both at step 6; on seed 1 troll at 12 (0.625), clip never
    assert "| 0 | 0.750 | 12 | 6 | 6 | 6 |" in out and "| 1 | 0.500 | 12 | 6 | 12 | not reached |" in out
    assert script.steps_to_reach({0: 0.5, 6: 0.5}, 0.75) is None
    # HumanEval: 7 of 141 before; troll - clip (10 - 11, 9 - 8) / 141 = -0.00709, +0.00709: mean 0
    lines = out.splitlines()
    assert lines[lines.index("| model | n | greedy pass@1 | solved |") + 2] == "| base | 141 | 0.050 | 7 |"  # first
    assert "| 0: -0.007, 1: +0.007 | +0.000 |" in out


def test_code_family_table_worked_by_hand(tmp_path, capsys):
    """experiments/code_family.py on a run built by hand: held-out accuracy at steps 0 and 6, the left-out family's
    evaluations before training and at step 6, by function."""
    import json

    spec = importlib.util.spec_from_file_location("code_family", SCRIPT.parent / "code_family.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"options": {"task": "code_except_string", "beta": 0.5}}))
    rows = [{"step": 0, "heldout/accuracy": 0.5}, {"step": 3, "reward": 1.0}, {"step": 6, "heldout/accuracy": 0.625}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def result(solved: dict) -> dict:
        by = {f: {"pass_at_1": s / 4, "n": 4, "family": "string"} for f, s in solved.items()}
        return {"n": 8, "pass_at_1": sum(solved.values()) / 8, "by_function": by}

    (tmp_path / "base-string.json").write_text(json.dumps(result({"prefix": 3, "repeat_text": 4})))
    (run / "string-step6.json").write_text(json.dumps(result({"prefix": 0, "repeat_text": 4})))
    assert script.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| r1 | 0.5 | 0 | 0.500 | string | 0.875 | 3/4 | 4/4 |" in out
    assert "| r1 | 0.5 | 6 | 0.625 | string | 0.500 | 0/4 | 4/4 |" in out
    assert "| `prefix` | `repeat_text` |" in out


def test_docs_quote_the_code_family_table():
    """docs/code.md, "A family held out of training", quotes experiments/code_family.py on docs/data/code-family."""
    spec = importlib.util.spec_from_file_location("code_family", SCRIPT.parent / "code_family.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    repo = SCRIPT.parent.parent
    rows = [line for line in script.table(repo / "docs" / "data" / "code-family").splitlines() if line.startswith("|")]
    page = (repo / "docs" / "code.md").read_text()
    assert len(rows) > 10
    assert [row for row in rows if row not in page] == []
