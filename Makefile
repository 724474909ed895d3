# slurm-burst: `make demo` and `make test` each set up everything they need
# (Debian packages, a .venv in the repo root) and are safe to run again.
SHELL := /bin/bash
# Python writes its bytecode caches here even where the caller's environment says not to:
# without them every test run compiles the package and its tests again (seconds).
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SB := $(VENV)/bin/slurm-burst
LAB_CONFIG := slurm-conf/lab/slurm-burst.toml
LAB_SLURM_CONF := /var/lib/slurm-burst-lab/etc/slurm/slurm.conf

.PHONY: help setup system venv demo demo-training test test-full test-release release-tests test-fast bench \
	soak lab-up lab-down lint lint-ansible docs clean

help:
	@echo "make demo      set up, bring the lab up, run a 2-node job on burst cloud nodes"
	@echo "make demo-training  the same, then a 4-node MPI training run that survives a spot reclaim"
	@echo "make test      set up and run the test suite, under 40 min (root: the lab tests need it)"
	@echo "make test-full every test on every Slurm release, the long forms too (hours)"
	@echo "make test-release RELEASE=24.11  the lab tests on another Slurm release"
	@echo "make test-fast the unit tests alone (seconds, any user)"
	@echo "make bench     set up and print the benchmark figures (QUICK=1: small sizes, minutes)"
	@echo "make soak      200 burst cycles in the lab, then nothing left and nothing grown"
	@echo "make lab-down  remove the lab: processes, namespaces, links, files"
	@echo "make lint      ruff, mypy (strict: package, tests, benchmarks), ansible-lint"
	@echo "make docs      regenerate the generated sections of docs/"

setup: system venv

system:
	@scripts/setup-system.sh

# Re-install when packaging metadata changes; the stamp lives inside the venv.
# The product with its test tools, and the lab (lab/, a distribution of its own).
$(VENV)/.installed: setup.cfg pyproject.toml lab/setup.cfg lab/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' -e ./lab
	@touch $@

venv: $(VENV)/.installed

demo: setup
	scripts/demo.sh

# the second demo: a 4-node MPI training run on Spot nodes that survives a reclaim
# (docs/training.md); LAB_SLURM as for make demo
demo-training: setup
	scripts/demo-training.sh

# LAB_SLURM=24.11 (or 26.05) brings the lab up on that release, as make demo does
lab-up: setup
	$(SB) --config $(LAB_CONFIG) lab up $(if $(LAB_SLURM),--slurm $(LAB_SLURM))

lab-down: venv
	$(SB) --config $(LAB_CONFIG) lab down --yes

# On each other Slurm release the lab runs (from its image; docs/slurm-versions.md) the
# burst end to end (a 2-node job over WireGuard, a GPU job's gres; the rest of
# test_x_burst is our own code, run on 22.05) and the lab's removal; then each release
# a share of the rest, so that each newer release is
# covered and CI stays in its time: 24.11 a requeue through the prolog, the faults that
# touch Slurm's states and an array's stage-in (burst_buffer/lua's hooks' arguments
# differ by release), a spot launch whose capacity never comes (EC2's and Azure's;
# GCE's is make test-full's), a job
# on Azure VMs (its VMs boot 24.11's image), two
# cloud nodes talking off the hub (the ledger's read of its sacct: test_slurm_versions,
# in 22.05's run);
# 26.05 the ledger and a budget Slurm enforces, the burst policy's read and update of the
# queue, stage-in's bad copy sent again and sensitive data
# refused, stage-out's outputs home before release, a spot refusal run on-demand in a
# placement group (EC2's and GCE's: its VMs boot 26.05's image) and an interruption
# notice's signal and requeue (EC2's; GCE's preemption is make test-full's), and a node
# group's cap (its drain of powered-down nodes and a
# hand-made power_up refused).
# The whole suite runs on the host's release (22.05) first, but for those two shares:
# each runs once, on its own release (CI's time; the code under them is the same).
LAB_RELEASES := 24.11 26.05
VERSION_TESTS_COMMON := tests/lab/test_lab.py \
	tests/lab/test_x_burst.py::test_two_node_job_runs_on_cloud_nodes_joined_over_wireguard \
	tests/lab/test_x_burst.py::test_gpu_job_runs_with_the_group_gres
VERSION_TESTS_24.11 := \
	tests/lab/test_x_prolog.py::test_a_node_failing_in_bootstrap_requeues_its_job_which_then_runs \
	tests/lab/test_y_faults.py::test_a_node_whose_slurmd_release_slurmctld_cannot_take_is_refused \
	tests/lab/test_y_faults.py::test_suspend_during_bootstrap \
	tests/lab/test_y_faults.py::test_slurmctld_restarted_mid_resume \
	tests/lab/test_x_stage.py::test_each_task_of_an_array_gets_its_data \
	tests/lab/test_x_ec2.py::test_spot_withheld_falls_back_after_the_wait_and_the_job_runs \
	tests/lab/test_x_azure.py::test_spot_withheld_falls_back_after_the_wait_and_the_job_runs \
	tests/lab/test_x_azure.py::test_a_job_runs_on_azure_vms_on_a_newer_release \
	tests/lab/test_x_mesh_direct.py \
	tests/lab/test_x_dynamic.py::test_a_job_bursts_onto_dynamic_nodes_through_a_slurmctld_restart
# The suspend path (SuspendTime, the SuspendProgram's release) on 26.05 only: 24.11 and
# 26.05 call it alike (the 23.02 interface); 22.05's own runs on the host.
VERSION_TESTS_26.05 := \
	tests/lab/test_x_burst.py::test_idle_nodes_are_suspended_and_everything_released \
	tests/lab/test_y_ledger.py \
	tests/lab/test_x_policy.py::test_a_long_wait_bursts_and_a_short_one_stays_on_prem \
	tests/lab/test_x_stage.py::test_a_corrupt_object_in_the_store_never_reaches_the_job_and_is_sent_again \
	tests/lab/test_x_stage.py::test_sensitive_data_is_refused_at_submit_and_by_the_daemon_and_nothing_leaves \
	tests/lab/test_x_stage.py::test_outputs_come_home_verified_and_their_node_outlives_suspend_time_until_they_do \
	tests/lab/test_x_ec2.py::test_spot_refused_runs_a_4_node_job_on_demand_in_one_placement_group \
	tests/lab/test_x_ec2.py::test_an_interruption_notice_signals_the_job_which_is_requeued_and_completes_elsewhere \
	tests/lab/test_x_gce.py::test_spot_refused_runs_a_4_node_job_on_demand_in_one_compact_placement_policy \
	tests/lab/test_x_gce.py::test_a_preemption_signals_the_job_which_is_requeued_and_completes_on_a_replacement \
	tests/lab/test_x_cap.py \
	tests/lab/test_x_dynamic.py::test_a_lowered_limit_deletes_the_nodes_once_released \
	tests/lab/test_x_observability.py::test_slurmctlds_own_series_feed_the_slurm_panels_and_the_down_alert
# On the host's release and again on the newest: the README's make demo (scripts/demo.sh).
NEWEST_TOO := tests/lab/test_zy_demo.py
NEWEST := 26.05
version_tests = $(VERSION_TESTS_COMMON) $(VERSION_TESTS_$(1)) \
	$(if $(filter $(NEWEST),$(1)),$(NEWEST_TOO)) \
	tests/lab/test_zz_lab_down.py::test_down_removes_everything
# As root the other releases run their shares; the host's run leaves them out.
RELEASE_SHARES := $(foreach r,$(LAB_RELEASES),$(VERSION_TESTS_$(r)))
# The soak runs on its own through `make soak` (its short form), after the host's run.
ROOT_ONLY_ARGS = $(if $(filter 0,$(shell id -u)),$(addprefix --deselect ,$(RELEASE_SHARES)) \
	--ignore tests/lab/test_z_soak.py)

# make test, as root: the unit and integration tiers in a process of their own beside the
# lab's tests on the host's Slurm (they share nothing with the lab: their servers are on
# free loopback ports; nice 19, so the lab comes first; their output is printed once they
# end), and beside them `lab images` builds the other releases' images and the blank host
# (downloads: off the critical path; a test that needs one meanwhile waits for its build,
# and a build that failed is tried again, and fails the run, where it is needed), then the
# soak's short form through `make soak` (the README's command), then the other releases'
# shares. As any other user: every tier in one run (the lab's skip).
# Tests marked `full` (docs/testing.md says which and why) run only in make test-full;
# SLURM_BURST_TEST_FULL=1 gives the others their long forms there. Each run writes a
# JUnit report; the recap of them all (each run's totals and wall time, each failure, the
# slowest tests) is printed last, so that a log read from its tail names every failure
# and where the time went. pytest's exit 5 (nothing collected) fails the run.
RESULTS := .make/test-results
SOAK_SHORT := 8
define run_step
echo "== $(1) ($$(date +%T))"; $(2); v=$$?; \
if [ $$v -eq 5 ]; then echo "pytest: no tests were collected ($(1))"; v=1; fi; \
[ $$rc -ne 0 ] || rc=$$v
endef

test: setup
	@set +e; rm -rf $(RESULTS); mkdir -p $(RESULTS); rc=0; \
	if [ "$$(id -u)" = 0 ]; then \
		echo "== the lab's images (Debian downloads), built beside the host's run"; \
		(nice -n 10 $(SB) --config $(LAB_CONFIG) lab images > $(RESULTS)/images.log 2>&1) & \
		images=$$!; \
		echo "== unit and integration, beside the lab (output below, once they end)"; \
		(nice -n 19 $(PY) -m pytest -m "not full" tests/unit tests/integration \
			--junitxml=$(RESULTS)/tiers.xml $(PYTEST_ARGS) > $(RESULTS)/tiers.log 2>&1; \
			echo $$? > $(RESULTS)/tiers.rc) & tiers=$$!; \
		$(call run_step,the lab on Slurm 22.05,$(PY) -m pytest -m "not full" tests/lab \
			$(ROOT_ONLY_ARGS) --junitxml=$(RESULTS)/lab-22.05.xml $(PYTEST_ARGS)); \
		wait $$tiers; \
		$(call run_step,unit and integration (they ran beside the lab),cat $(RESULTS)/tiers.log; \
			(exit $$(cat $(RESULTS)/tiers.rc 2>/dev/null || echo 1))); \
		wait $$images; echo "== the lab's images ($$(date +%T))"; cat $(RESULTS)/images.log; \
		$(call run_step,make soak SOAK_CYCLES=$(SOAK_SHORT),$(MAKE) --no-print-directory soak \
			SOAK_CYCLES=$(SOAK_SHORT) PYTEST_ARGS="--junitxml=$(RESULTS)/soak.xml $(PYTEST_ARGS)"); \
		for r in $(LAB_RELEASES); do \
			$(call run_step,the lab on Slurm $$r,$(MAKE) --no-print-directory release-tests \
				RELEASE=$$r PYTEST_ARGS="--junitxml=$(RESULTS)/lab-$$r.xml $(PYTEST_ARGS)"); \
		done; \
	else \
		$(call run_step,every tier (the lab's tests need root and skip),$(PY) -m pytest \
			-m "not full" --junitxml=$(RESULTS)/tiers.xml $(PYTEST_ARGS)); \
	fi; \
	$(PY) scripts/test-recap.py $(RESULTS); exit $$rc

# The set-up from nothing on a blank host needs no Slurm of the lab's: the host's run only.
SETUP_TEST := tests/lab/test_setup_from_nothing.py
# make test-full: every test on every release the lab has, the long forms included (the
# 200-cycle soak; the tests marked `full`), then every benchmark in its quick form; hours,
# not for CI.
test-full: setup
	@set +e; rm -rf $(RESULTS); mkdir -p $(RESULTS); rc=0; \
	export SLURM_BURST_TEST_FULL=1; \
	$(call run_step,every test on Slurm 22.05,SOAK_CYCLES=200 $(PY) -m pytest \
		-o timeout=5400 --junitxml=$(RESULTS)/host.xml $(PYTEST_ARGS)); \
	if [ "$$(id -u)" = 0 ]; then for r in $(LAB_RELEASES); do \
		$(call run_step,every lab test on Slurm $$r,SLURM_BURST_LAB_SLURM=$$r $(PY) -m pytest \
			tests/lab --ignore $(SETUP_TEST) -o timeout=5400 \
			--junitxml=$(RESULTS)/lab-$$r.xml $(PYTEST_ARGS)); \
		done; fi; \
	$(call run_step,make bench QUICK=1,$(MAKE) --no-print-directory bench QUICK=1); \
	$(PY) scripts/test-recap.py $(RESULTS); exit $$rc

# The lab tests on one other release: make test-release RELEASE=24.11
test-release: setup release-tests

release-tests:
	SLURM_BURST_LAB_SLURM=$(RELEASE) $(PY) -m pytest -m "not full" \
		$(call version_tests,$(RELEASE)) $(PYTEST_ARGS)

# The unit tier alone: pure, in-memory, seconds, no root; on every core (pytest-xdist),
# with a tenth of the generated examples (the hypothesis profile `fast`,
# tests/conftest.py); make test runs them all.
test-fast: venv
	$(PY) -m pytest tests/unit --hypothesis-profile=fast -n auto --dist worksteal $(PYTEST_ARGS)

# QUICK=1: every benchmark at a size that runs in seconds (make test-full runs it so)
bench: setup
	$(PY) benchmarks/run.py $(if $(QUICK),--quick)

# The soak (tests/lab/test_z_soak.py); make test runs it with 8 cycles, make test-full 200.
SOAK_CYCLES ?= 200
soak: setup
	SOAK_CYCLES=$(SOAK_CYCLES) $(PY) -m pytest tests/lab/test_z_soak.py -p no:cacheprovider \
		-o timeout=5400 -rs $(PYTEST_ARGS)

lint: venv lint-ansible
	$(VENV)/bin/ruff check slurm_burst lab tests benchmarks scripts ansible/plugins
	$(VENV)/bin/mypy slurm_burst lab/slurm_burst_lab tests benchmarks scripts/docs.py scripts/test-recap.py

# ansible-lint (production profile, offline) with this checkout's collection installed
lint-ansible: venv
	@d=$$(mktemp -d); mkdir -p $$d/ansible_collections/slurm_burst; \
	ln -s "$$PWD/ansible" $$d/ansible_collections/slurm_burst/deploy; \
	cd ansible && ANSIBLE_COLLECTIONS_PATH=$$d PATH="$$PWD/../$(VENV)/bin:$$PATH" \
		../$(VENV)/bin/ansible-lint; rc=$$?; rm -rf $$d; exit $$rc

docs: venv
	$(PY) scripts/docs.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info lab/build lab/*.egg-info
