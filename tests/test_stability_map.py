"""The stability map's report (experiments/stability_map.py) on fabricated study folders: which cells it compares, the
every-seed and best-setting facts, the paired differences, the extras, and that it writes its files. Fast: no model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from troll.lm.options import RunOptions

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "stability_map.py"
_spec = importlib.util.spec_from_file_location("stability_map", SCRIPT)
sm = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sm  # its dataclasses look their module up by name
_spec.loader.exec_module(sm)

START = 0.30
# acc. after per (arm, lr, reuse) and seed: troll ends above its start on every seed up to lr 2e-5 and reuse 4, clip
# likewise; troll is best at 2e-5 and clip at 1e-5, each 0.04 apart on every seed there.
AFTER = {
    ("troll", 1e-5, 4): [0.40, 0.41, 0.42],
    ("troll", 2e-5, 4): [0.50, 0.51, 0.52],
    ("troll", 4e-5, 4): [0.35, 0.37, 0.20],
    ("clip", 1e-5, 4): [0.46, 0.47, 0.48],
    ("clip", 2e-5, 4): [0.44, 0.45, 0.46],
    ("clip", 4e-5, 4): [0.10, 0.15, 0.20],
    ("troll", 2e-5, 1): [0.45, 0.46, 0.47],
    ("clip", 2e-5, 1): [0.43, 0.44, 0.45],
    ("troll", 2e-5, 16): [0.28, 0.40, 0.41],
    ("clip", 2e-5, 16): [0.25, 0.26, 0.27],
    ("troll:tail=renormalize", 2e-5, 4): [0.45, 0.48, 0.48],
    ("troll:kl-bound=0.2", 2e-5, 4): [0.52, 0.51, 0.56],
    ("troll_seq:agg=token-mean", 2e-5, 4): [0.40, 0.40, 0.40],
    ("gspo_tm", 2e-5, 4): [0.30, 0.35, 0.34],
}
SHARES = {"old_top8": 0.5, "support": 0.3, "rest": 0.2}


def options(arm: str, lr: float, reuse: int, seed: int, **extra) -> RunOptions:
    loss, *parts = arm.split(":")
    overrides = {}
    for part in parts:
        key, value = part.split("=")
        overrides[key.replace("-", "_")] = float(value) if key == "kl-bound" else value
    settings = dict(steps=8, eval_every=4, generations=8, prompts_per_step=2 * reuse) | extra
    opts = RunOptions(loss=loss, lr=lr, steps_per_rollout=reuse, seed=seed, **overrides, **settings)
    return opts.resolved()


def write_cell(folder: Path, opts: RunOptions, after: float, peak: float) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"command": "train", "options": opts.to_json()}))
    rows = [{"step": 0, "heldout/accuracy": START}]
    for step in range(1, opts.steps + 1):
        on_policy = (step - 1) % opts.steps_per_rollout == 0
        kl = 0.0 if on_policy else opts.lr * 1000 * step / opts.steps  # grows with lr: 0.01 .. 0.08 at the end
        row = {"step": step, "loss": 0.1, "troll/kl_before/mean": kl, "troll/kl_before/max": 4 * kl}
        row.update({f"troll/kl_share/{k}": 0.0 if on_policy else v for k, v in SHARES.items()})
        rows.append(row)
    rows.append({"step": 4, "heldout/accuracy": peak})
    rows.append({"step": opts.steps, "heldout/accuracy": after})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"heldout_accuracy_before": START, "heldout_accuracy_after": after, "reward_last_quarter_mean": 0.2}
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def map_folder(tmp_path):
    """Cells laid out as make map's studies lay them out (the report only looks for finished cells)."""
    root = tmp_path / "map"
    for (arm, lr, reuse), accs in AFTER.items():
        for seed, after in enumerate(accs):
            study = f"lr={lr}" if reuse == 4 and ":" not in arm and "gspo" not in arm else f"reuse{reuse}-extras"
            write_cell(root / "chain_sum" / study / arm / f"seed{seed}", options(arm, lr, reuse, seed), after,
                       peak=after + 0.05)  # fmt: skip
    # not comparable (other steps), and unfinished (no summary): both left out
    write_cell(root / "odd" / "troll" / "seed0", options("troll", 2e-5, 4, 0, steps=12), 0.9, 0.9)
    (root / "running" / "troll" / "seed1").mkdir(parents=True)
    (root / "running" / "troll" / "seed1" / "config.json").write_text("{}")
    return root


def test_arm_labels_name_what_sets_a_run_apart():
    def label(loss, **kw):
        return sm.arm_label(RunOptions(loss=loss, **kw).resolved())

    assert label("troll") == "troll" and label("clip") == "clip" and label("grpo") == "grpo"
    assert label("troll", tail="renormalize") == "troll:tail=renormalize"
    assert label("troll", kl_bound=0.2) == "troll:kl-bound=0.2"
    assert label("troll_seq", agg="token-mean") == "troll_seq:agg=token-mean"
    assert label("clip", clip_eps_high=0.28) == "clip:clip-eps-high=0.28"
    assert label("clip", dual_clip=0.0) == "clip:dual-clip=0" and label("grpo", dual_clip=3.0) == "grpo:dual-clip=3"
    assert label("gspo_tm") == "gspo_tm" and label("grpo", tail="renormalize") == "grpo:tail=renormalize"


def test_reference_of_a_variant():
    present = {"troll", "clip", "troll:tail=renormalize", "troll_seq:agg=token-mean", "gspo_tm"}
    assert sm.reference_of("troll:tail=renormalize", present) == "troll"
    assert sm.reference_of("troll_seq:agg=token-mean", present) == "gspo_tm"
    assert sm.reference_of("troll", present) is None and sm.reference_of("gspo_tm", present) is None


def test_map_by_hand(map_folder):
    result = sm.write_map(map_folder)
    assert list(result) == ["chain_sum"]
    t = result["chain_sum"]
    assert t["left_out"] == 1 and t["base"]["steps"] == 8 and t["base"]["completions_per_step"] == 16
    assert (t["reuse_of_lr_sweep"], t["lr_of_reuse_sweep"]) == (4, 2e-5)
    summary = {s["arm"]: s for s in t["summary"]}
    assert summary["troll"] == {"arm": "troll", "largest_lr": 2e-5, "largest_reuse": 4, "best_lr": 2e-5,
                                "best_reuse": 4}  # fmt: skip
    assert summary["clip"] == {"arm": "clip", "largest_lr": 2e-5, "largest_reuse": 4, "best_lr": 1e-5,
                               "best_reuse": 4}  # fmt: skip
    point = next(p for p in t["lr"]["troll"] if p["lr"] == 4e-5)
    assert point["seeds"] == [0, 1, 2] and point["above_start_every_seed"] is False
    assert point["acc_after"]["mean"] == pytest.approx(0.92 / 3) and point["acc_peak"]["mean"] == pytest.approx(
        0.92 / 3 + 0.05
    )
    # the KL reached: mean over the off-policy steps 2, 3, 4, 6, 7, 8 of lr * 1000 * step / 8
    assert point["kl_mean"]["mean"] == pytest.approx(4e-5 * 1000 * 30 / 6 / 8)
    assert point["share_rest"]["mean"] == pytest.approx(0.2) and point["kl_max"]["mean"] == pytest.approx(0.16)
    best = [r for r in t["paired"] if r["at"] == "best" and r["axis"] == "lr" and r["metric"] == "acc_after"][0]
    assert (best["troll_at"], best["baseline_at"]) == (2e-5, 1e-5)
    assert best["diffs"] == {0: pytest.approx(0.04), 1: pytest.approx(0.04), 2: pytest.approx(0.04)}
    assert best["mean"] == pytest.approx(0.04) and best["ci95"] == [pytest.approx(0.04), pytest.approx(0.04)]
    shared = [r for r in t["paired"] if r["axis"] == "reuse" and r["at"] == 16 and r["metric"] == "acc_peak"][0]
    assert shared["mean"] == pytest.approx((0.03 + 0.14 + 0.14) / 3)
    extras = {(r["arm"], r["reference"], r["metric"]): r for r in t["extras"]}
    arms = [("troll:tail=renormalize", "troll"), ("troll:kl-bound=0.2", "troll")]
    arms.append(("troll_seq:agg=token-mean", "gspo_tm"))
    assert set(extras) == {(a, ref, m) for a, ref in arms for m in ("acc_after", "acc_peak", "kl_mean")}
    tail = extras["troll:tail=renormalize", "troll", "acc_after"]
    assert tail["diffs"] == {0: pytest.approx(-0.05), 1: pytest.approx(-0.03), 2: pytest.approx(-0.04)}
    assert tail["arm_mean"] == pytest.approx(1.41 / 3) and tail["reference_mean"] == pytest.approx(0.51)
    assert extras["troll_seq:agg=token-mean", "gspo_tm", "acc_after"]["mean"] == pytest.approx(0.07)

    table = (map_folder / "map.md").read_text()
    assert "| troll | 2e-05 | 4 | 2e-05 | 4 |" in table and "| clip | 2e-05 | 4 | 1e-05 | 4 |" in table
    assert "| lr | best (2e-05 vs 1e-05) | held-out acc. after | s0: +0.040, s1: +0.040, s2: +0.040 | +0.040 |" in table
    assert "| 2e-05 | 4 | troll:tail=renormalize - troll | held-out acc. after |" in table
    assert "1 cell(s) with other settings left out" in table
    shares = " / ".join(f"{SHARES[k]:.2f}" for k in ("old_top8", "support", "rest"))
    assert f" | {shares} |\n" in table  # the KL's parts, off-policy steps only
    for name in ("map_lr.png", "map_reuse.png", "map_kl.png", "map_kl_share.png"):
        assert (map_folder / name).stat().st_size > 10_000, name
    saved = json.loads((map_folder / "map.json").read_text())
    assert saved["cells"] == sum(len(v) for v in AFTER.values()) + 1 and saved["baseline"] == "clip"


def test_command_line(map_folder, tmp_path, capsys):
    out = tmp_path / "report"
    assert sm.main([str(map_folder), "--out", str(out)]) == 0
    assert (out / "map.md").is_file() and not (map_folder / "map.md").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sm.main([str(empty)]) == 2
    assert "no finished troll train cell below" in capsys.readouterr().err
