# Set-up on a fresh machine is part of every target: the virtual environment is created if missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make bench` writes its tables here, never over the published ones in benchmarks/results/
BENCH_OUT ?= runs/bench

export MPLBACKEND := Agg
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1

.PHONY: demo test test-all test-kernels lint bench docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[flower,export,track,docs,dev]"
	touch $(STAMP)

demo: $(STAMP)  ## the main job: the default experiment on the embedded digits data
	$(VENV)/bin/fedistill run

test: $(STAMP)  ## the fast test suite (what CI runs)
	$(PY) -m pytest

test-all: $(STAMP)  ## every test, slow ones included
	$(PY) -m pytest -m ""

# Another CPU's arithmetic on this one (x86-64): the fast suite through the AVX2 and the SSE4.1 kernels of
# PyTorch, oneDNN, NumPy (its sorts, partitions and math functions) and OpenBLAS, whatever this CPU has.
# A test that passes on one CPU only is a failing test.
NUMPY_BELOW_AVX512 := X86_V4 AVX512_ICL AVX512_SPR
test-kernels: $(STAMP)  ## the fast suite on the AVX2 and SSE4.1 kernel paths (about twice `make test`)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 NPY_DISABLE_CPU_FEATURES="$(NUMPY_BELOW_AVX512)" \
		OPENBLAS_CORETYPE=Haswell $(PY) -m pytest -q
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 NPY_DISABLE_CPU_FEATURES="X86_V3 $(NUMPY_BELOW_AVX512)" \
		OPENBLAS_CORETYPE=Nehalem $(PY) -m pytest -q

bench: $(STAMP)  ## quick speed checks at small settings: FedIOD step time, transport speed (in-process, simulation)
	$(PY) benchmarks/fediod_step_time.py --steps 2 --results $(BENCH_OUT)
	$(PY) benchmarks/flower_speed.py --transports inprocess,simulation --fedavg-rounds 2 --fediod-epochs 2 \
		--fediod-iters 2 --results $(BENCH_OUT)

docs: $(STAMP)  ## the documentation site: results pages refreshed from benchmarks/results, then built with --strict into build/site
	$(PY) -m fedistill.reference.results
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks docs

clean:
	rm -rf $(VENV) runs .pytest_cache
