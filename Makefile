# Set-up and entry points. `make run` and `make test` work on a fresh machine.
VENV    ?= .venv
PY      := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
INSTALLED := $(VENV)/.installed
FMNIST  := /usr/share/datasets/fashion-mnist

.PHONY: install data run test lint format recheck rehearse test-slurm test-mkl-intel test-avx2 test-flower test-flower-deploy bench benchmark mutants generate docs docs-browser clean

install: $(INSTALLED) data

$(INSTALLED): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@
	@echo "installed: 'source $(VENV)/bin/activate' puts fedssl, snakemake and dvc on PATH in a shell"

# The embedded default data set, from Debian's package (skipped where apt is not available).
data:
	@if [ ! -d $(FMNIST) ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq dataset-fashion-mnist; \
	  else echo "apt-get not found: install Fashion-MNIST into $(FMNIST) or set data_root in params/datasets/fashion_mnist.yaml"; fi; \
	fi

run: install
	snakemake --cores all --resources gpu=1
	@echo; cat results/reports/default/report.md
	@echo; $(PY) -m fedssl.plan.recheck default --compare-only || true
	@echo "Results: results/reports/default/ (report.md, .csv, .json) and results/experiments/*/metrics.json; artifacts in artifacts/"

# The benchmark board (README 'Benchmark'): every method on the same partitions, seeds 0-2, one
# budget; resumable (a rerun skips finished stages, a killed one resumes from its checkpoint).
# Then the board (results/reports/$(BOARD)/board.md, board.json) and the docs' board page.
# `make benchmark BOARD=benchmark_gpu` for the GPU-scale board.
BOARD ?= benchmark
benchmark: install
	snakemake --cores all --resources gpu=1 --rerun-incomplete --config pipeline=$(BOARD)
	$(PY) -m fedssl.reporting.board render $(BOARD)
	$(PY) -m fedssl.reporting.docs
	$(PY) -m fedssl.pipeline write $(BOARD)

# The suite runs on every core (pytest-xdist), each test module on one worker so that a project
# its tests share is built once; opt-in parts: `pytest -m slow`, make test-slurm.
test: install lint
	pytest -q -n auto --dist loadscope --no-loadscope-reorder

# Lint and format check (ruff: style, complexity, argument count), the architecture gate
# (import-linter: the library's layers, method packages independent; pyproject.toml), and the
# documentation site builds with no warning (broken links and anchors included);
# `make format` rewrites the files.
lint: $(INSTALLED)
	ruff check fedssl stages tests benchmarks docs/hooks.py
	ruff format --check fedssl stages tests benchmarks docs/hooks.py
	lint-imports
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet

format: $(INSTALLED)
	ruff format fedssl stages tests benchmarks docs/hooks.py
	ruff check --fix fedssl stages tests benchmarks docs/hooks.py

# Opt-in: the pipeline through a real one-node SLURM cluster on localhost (root, Debian); the
# test stops the daemons it started and removes its /etc/slurm/slurm.conf link afterwards.
test-slurm: install
	apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null
	$(PY) -m pip install --quiet -e '.[slurm]'
	FEDSSL_SLURM_TEST=1 pytest -q tests/test_slurm.py

# Opt-in: the whole suite with MKL's Intel kernels on any x86 CPU (on another vendor's, MKL runs
# its generic ones: tests/mkl_dispatch.py); `make test` runs the bit-for-bit checks so already.
test-mkl-intel: install
	$(PY) -m tests.mkl_dispatch $(VENV)
	LD_PRELOAD=$(abspath $(VENV))/libmkl_intel_cpu.so pytest -q -n auto --dist loadscope --no-loadscope-reorder

# Opt-in: the whole suite with ATen's and oneDNN's kernels capped at AVX2, as a CPU without
# AVX-512 (a Zen 3, many Intel CPUs) runs them: bf16 falls back to fp32, other kernels sum.
test-avx2: install
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 pytest -q -n auto --dist loadscope --no-loadscope-reorder

# Opt-in: Flower (the adapter's simulation tests, then a SuperLink and two SuperNodes on localhost).
test-flower: install
	$(PY) -m pip install --quiet -e '.[flower]'
	FEDSSL_FLOWER_TEST=1 pytest -q tests/flower/test_flower_app.py tests/flower/test_flower_stage.py tests/flower/test_flower_secure.py tests/flower/test_flower_deploy.py tests/flower/test_flower_local.py tests/flower/test_flower_peer_bench.py

# CI (.ci/run, after `make test`): the Flower extra, its deployment's unit tests, and the
# deployment on localhost as the how-to sets it up (TLS, node keys, two SuperNodes each with its
# own project; a node killed mid-run; a task another local process took). The token and
# too-few-nodes refusals and the simulation tests stay in `make test-flower`.
FLOWER_CI := not callers_without_the_credentials and not too_few_nodes
test-flower-deploy: install
	$(PY) -m pip install --quiet -e '.[flower]'
	FEDSSL_FLOWER_TEST=1 pytest -q --durations=5 tests/flower/test_flower_secure.py tests/flower/test_flower_deploy.py tests/flower/test_flower_local.py tests/flower/test_flower_peer_bench.py -k '$(FLOWER_CI)'

# The speed benchmarks (README 'Speed'), each stopped after BENCH_BUDGET seconds; the first line
# names the CPU. Keep a run: make bench | tee results/bench/make_bench_<cpu>.txt
BENCH_BUDGET ?= 900
bench: install
	$(PY) benchmarks/bench.py --budget $(BENCH_BUDGET)

# Opt-in: every one-line mutant of a defining rule (benchmarks/mutants.yaml) applied to a copy of
# the tree, its killing tests run against it; reports the survivors (exit 1 if any), niced.
mutants: $(INSTALLED)
	nice $(PY) benchmarks/mutants.py

# Rerun a sample of every committed pipeline (one experiment each, one thread per stage) and
# compare its result files with the committed ones: identical, within the spread (of seeds,
# threads, precisions: README 'Reproducing a number') or differs beyond it.
recheck: install
	$(PY) -m fedssl.plan.recheck

# Opt-in: a dress rehearsal of every paper_* pipeline through Snakemake on tiny data sets in
# their real formats (one round or epoch per stage); `python -m tests.rehearsal --all` runs
# every experiment, not one per stage shape.
rehearse: install
	pytest -q -m rehearsal --durations=0 tests/test_rehearsal.py

# Regenerate the checked-in derived files (a test fails when they are stale).
generate: $(INSTALLED)
	$(PY) -m fedssl.experiment
	$(PY) -m fedssl.pipeline write

# Refill the docs' results pages (and the README's table) from the committed reports (a test
# fails when a page is stale), then build the site into site/ (`mkdocs serve` to browse it).
docs: $(INSTALLED)
	$(PY) -m fedssl.reporting.docs
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict

# Opt-in: open the built site in headless Chromium (Debian's `chromium`, installed here when
# missing): every image loaded, no broken link, on the home, a results page and the board page;
# and `dvc plots show`'s page, offline, with every chart drawn.
docs-browser: docs
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium; }
	pytest -q -m browser tests/test_docs_browser.py tests/test_offline_plots.py

clean:
	rm -rf artifacts .snakemake
