#!/usr/bin/env bash
# TCE against its black-box baseline BBRL on one task, over seeds: a `troll tce study` (docs/tce.md, "How to run").
#
# Each cell is a `troll tce train` run in <out>/<algo>/seed<k>/; the study then writes <out>/study.md (mean and
# standard error over seeds, paired TCE - BBRL differences with 95% intervals), study.json and study.png.
#
#   pip install "troll[episodic]"            # gymnasium, MuJoCo, Meta-World, EnvPool; add [baselines] for --algos ppo
#   bash examples/tce_study.sh                                  # the toy task, 3 seeds, the preset's 896k env steps
#   ENV=gym/reacher-sparse ALGOS=tce,bbrl,ppo bash examples/tce_study.sh
#   ENV=metaworld/reach-v3 STEPS=480000 OUT=runs/reach bash examples/tce_study.sh --mean-bound 0.01
#
# Extra arguments go to `troll tce study` (any `troll tce train` option, e.g. --sweep mean-bound=0.05,0.1). The
# study refuses an OUT that already holds results; `--resume` continues it. TROLL="python -m troll.cli" runs troll
# from a source tree without installing it.
set -euo pipefail

ENV=${ENV:-toy/viapoint}
ALGOS=${ALGOS:-tce,bbrl}
SEEDS=${SEEDS:-3}
JOBS=${JOBS:-2}
OUT=${OUT:-runs/tce-study-${ENV//\//-}}
STEPS=${STEPS:-}    # empty: the preset's budget
read -r -a TROLL <<< "${TROLL:-troll}"

"${TROLL[@]}" tce study --env "$ENV" --algos "$ALGOS" --seeds "$SEEDS" --jobs "$JOBS" --out "$OUT" \
    ${STEPS:+--steps "$STEPS"} "$@"
cat "$OUT/study.md"
