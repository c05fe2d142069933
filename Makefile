# criu-rocm: the user's door to the build. meson.build is the packager's door over the
# same targets (it calls this file), so there is one build graph.
#
#   make              build build/criu-rocm
#   make test         everything CI runs (as root)
#   make install      PREFIX=/usr/local DESTDIR=

PREFIX		?= /usr/local
BINDIR		?= $(PREFIX)/bin
MANDIR		?= $(PREFIX)/share/man
DESTDIR		?=
JOBS		?= 2

TOP		:= $(CURDIR)
BUILD		:= build
include criu/upstream.lock
CRIU_TREE	:= $(BUILD)/criu-$(CRIU_VERSION)
TARBALL		:= $(BUILD)/cache/$(CRIU_TARBALL_NAME)
CARGO		?= cargo
CARGO_TARGET	:= $(TOP)/rust/target
GPU_LIB		:= $(CARGO_TARGET)/release/libcriu_gpu.a
CRUN_CRIU	:= $(BUILD)/crun-criu
# The git revision criu-rocm reports. A source tree without git (the Debian package's, a
# release tarball) carries it in .gitrev, as CRIU's own tree carries .gitid.
ifneq ($(wildcard $(TOP)/.gitrev),)
GITREV		:= $(shell cat $(TOP)/.gitrev)
else
GITREV		:= $(shell git -C $(TOP) describe --always --dirty 2>/dev/null || echo unknown)
endif
PYTHON		:= /usr/bin/python3

# Builds in the CRIU tree (prepare, criu, lib, zdtm) take this lock, so two makes run at
# once (make demo beside make test) wait for each other instead of corrupting the tree's
# generated files.
TREE_LOCK	:= flock $(BUILD)/.tree.lock

CRIU_INPUTS	:= criu/upstream.lock criu/patches/series $(wildcard criu/patches/*.patch) \
		   $(wildcard criu/*.c) $(wildcard criu/pie/*.c) $(wildcard criu/include/*.h) \
		   scripts/prepare-criu.sh

all: $(BUILD)/criu-rocm
.PHONY: all deps criu-rocm rust-lib test print-test-suites test-rust test-smoke test-rocm64 test-zdtm test-install \
	zdtm-compare install clean bench demo FORCE

deps:
	scripts/install-deps.sh

criu-rocm: $(BUILD)/criu-rocm

# The pinned upstream tarball, cached under build/cache (from CRIU_TARBALL when set, else
# the Debian source package). fetch-criu.sh checks the sha256 again before every extraction,
# so a damaged cache is fetched anew rather than unpacked.
$(TARBALL): criu/upstream.lock
	scripts/fetch-criu.sh >/dev/null

# A pristine extraction with our patch series; redone whenever an input changes.
$(CRIU_TREE)/.prepared: $(TARBALL) $(CRIU_INPUTS)
	tarball=$$(scripts/fetch-criu.sh) && $(TREE_LOCK) scripts/prepare-criu.sh "$$tarball" $(CRIU_TREE)
	touch $@

rust-lib: $(GPU_LIB)

# Cargo decides what to rebuild; the recipe on the library itself makes make look at its
# time again after cargo ran, so criu-rocm is relinked in the same make that rebuilt it.
$(GPU_LIB): FORCE
	cd rust && $(CARGO) build --release --locked -p criu-gpu -q

# The git revision is compiled into criu-rocm.o; rebuild it when the revision moves.
$(BUILD)/gitrev: FORCE
	@mkdir -p $(BUILD)
	@echo '$(GITREV)' | cmp -s - $@ || echo '$(GITREV)' >$@

$(BUILD)/criu-rocm: $(CRIU_TREE)/.prepared $(GPU_LIB) $(BUILD)/gitrev
	@if [ $(BUILD)/gitrev -nt $(CRIU_TREE)/criu/criu-rocm.o ]; then rm -f $(CRIU_TREE)/criu/criu-rocm.o; fi
	$(TREE_LOCK) $(MAKE) -C $(CRIU_TREE) -j$(JOBS) criu CRIU_GPU_LIB=$(GPU_LIB) CRIU_ROCM_GITREV=$(GITREV) \
		>$(BUILD)/criu-build.log 2>&1 || { tail -n 40 $(BUILD)/criu-build.log; exit 1; }
	cp $(CRIU_TREE)/criu/criu $@.tmp && mv $@.tmp $@
	@echo "built $@"

# Stock CRIU from the same tarball, unpatched: the reference for zdtm-compare.
$(BUILD)/stock/.prepared: $(TARBALL) scripts/prepare-criu.sh
	tarball=$$(scripts/fetch-criu.sh) && scripts/prepare-criu.sh "$$tarball" $(BUILD)/stock --no-patches
	touch $@

$(BUILD)/stock/criu/criu: $(BUILD)/stock/.prepared
	$(MAKE) -C $(BUILD)/stock -j$(JOBS) criu >$(BUILD)/stock-build.log 2>&1 || \
		{ tail -n 40 $(BUILD)/stock-build.log; exit 1; }

$(BUILD)/criu-rocm.8: Documentation/criu-rocm.8.adoc
	asciidoctor -b manpage -o $@ $<

# The suites `make test` runs, in order; .ci/run runs and counts them one by one.
TEST_SUITES	:= test-rust test-smoke test-rocm test-gem test-hip test-hip-cr test-rocm64 test-gpu test-integrity test-sdma test-rocm-cr test-zdtm test-zdtm-gpu test-demo \
		   test-containers test-install test-package test-rpc

# The user's entry points install what is missing first (scripts/install-deps.sh: quiet, and
# a no-op when all is there), so they work on a fresh Debian machine. Plain `make` and the
# file targets do not: a packager's build (meson, sbuild) must not run apt. The entry points
# depend on deps, and when one of them is a goal, every recipe that builds something waits
# for deps too (order-only), so `make -j` cannot start cargo or CRIU's build before it.
DEPS_GOALS	:= test $(TEST_SUITES) demo bench zdtm-compare deb crun-criu
ifneq ($(filter $(DEPS_GOALS),$(MAKECMDGOALS)),)
DEPS_FIRST	:= deps
endif
$(DEPS_GOALS): deps
$(TARBALL) $(GPU_LIB) kfd-tools $(BUILD)/stock/.prepared $(CRUN_CRIU)/bin/crun: | $(DEPS_FIRST)

test: $(TEST_SUITES)
	@echo "make test: all suites passed"

print-test-suites:
	@echo $(TEST_SUITES)

# The main job: GPU checkpoint/restore on the emulator end to end (builds what is missing,
# dumps gpu-workload on one emulated machine, restores it on another, prints a summary).
demo:
	@MAKE="$(MAKE)" CARGO="$(CARGO)" JOBS="$(JOBS)" scripts/demo.sh

# The demo as a test: the script's own checks, then the demo itself (non-zero on any failure).
.PHONY: test-demo
test-demo: $(BUILD)/criu-rocm kfd-tools
	test/demo/check.sh
	@MAKE="$(MAKE)" CARGO="$(CARGO)" JOBS="$(JOBS)" scripts/demo.sh

# Emulator ioctl latency and VRAM map throughput, then GPU checkpoint/restore against CRIU's
# own dump and restore of anonymous memory, the SDMA copy engine's against the CPU engine's
# (on the emulator's SDMA, under kfd-emu supervise), criu-rocm's dump RSS and how dump and restore
# grow with BOs and VMAs (scripts/bench-cr.sh; BENCH_CR_ONLY=scale runs that table alone),
# a whole HIP process' dump and restore (scripts/bench-hip.sh; `make bench-hip` alone),
# then ROCr's own hsa_amd_memory_async_copy (SDMA on the emulator) against memcpy, then the
# gfx9 shader engine's rate on a VALU-heavy and a memory-heavy loop (wave instructions/s), and
# inside kfd-emu on two of test/hip's kernels launched by HIP (scripts/bench-engine.sh).
bench: $(BUILD)/criu-rocm $(BUILD)/hsa-bench $(BUILD)/engine-bench
	cd rust && CARGO_TARGET_DIR=$(CARGO_TARGET) $(CARGO) build --release --locked -q -p kfd-emu -p kfd-client
	$(CARGO_TARGET)/release/kfd-emu run --profile mi100 -- sh -c \
		'$(CARGO_TARGET)/release/kfd-emu bench-ioctl && $(CARGO_TARGET)/release/emu-bench'
	CARGO_TARGET_DIR=$(CARGO_TARGET) scripts/bench-cr.sh
	CARGO_TARGET_DIR=$(CARGO_TARGET) scripts/bench-hip.sh
	$(CARGO_TARGET)/release/kfd-emu run --profile mi100 -- $(BUILD)/hsa-bench --mib 64 --reps 5 || \
		{ echo "make bench: ROCr's async copies failed on kfd-emu (the reason is above)" >&2; exit 1; }
	cd rust && CARGO_TARGET_DIR=$(CARGO_TARGET) $(CARGO) run --release --locked -q -p gfx9 --example rate
	CARGO_TARGET_DIR=$(CARGO_TARGET) ENGINE_BENCH=$(BUILD)/engine-bench scripts/bench-engine.sh
	cd rust && CARGO_TARGET_DIR=$(CARGO_TARGET) $(CARGO) run --release --locked -q -p kfd-emu --example cwsr_bench

# make bench's HIP row alone: a whole HIP process (VRAM and a kernel in flight) dumped and
# restored against CRIU's dump and restore of anonymous memory (scripts/bench-hip.sh).
.PHONY: bench-hip
bench-hip: $(BUILD)/criu-rocm
	cd rust && CARGO_TARGET_DIR=$(CARGO_TARGET) $(CARGO) build --release --locked -q -p kfd-emu
	CARGO_TARGET_DIR=$(CARGO_TARGET) scripts/bench-hip.sh

# Debian's HIP 5.2, unchanged, launching test/hip's kernels for scripts/bench-engine.sh.
$(BUILD)/engine-bench: test/rocm/engine-bench.c | $(DEPS_FIRST)
	@mkdir -p $(BUILD)
	cc -std=gnu11 -O2 -Wall -Wextra -Werror -o $@ $< -lamdhip64 -lm

# Debian's ROCr 5.2, unchanged, timing its async copies (test/rocm/hsa-bench.c).
$(BUILD)/hsa-bench: test/rocm/hsa-bench.c | $(DEPS_FIRST)
	@mkdir -p $(BUILD)
	cc -std=gnu11 -O2 -Wall -Wextra -Werror -o $@ $< -lhsa-runtime64

test-rust:
	scripts/check-structure.py
	cd rust && $(CARGO) fmt --all -- --check
	cd rust && $(CARGO) clippy --locked --workspace --all-targets -q -- -D warnings
	cd rust && $(CARGO) test --locked --workspace -q

test-smoke: $(BUILD)/criu-rocm
	test/smoke/run.sh $(BUILD)/criu-rocm

# Debian's ROCm 5.2 userspace unchanged on kfd-emu under every profile (test/rocm/run.sh):
# libhsakmt and ROCr test programs built against Debian's headers, rocminfo, and libdrm on
# the render nodes (test/rocm/drm-check.sh).
.PHONY: test-rocm
test-rocm: kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/rocm/run.sh

# Debian's libdrm_amdgpu on the render nodes' GEM side (test/rocm/gem-check.sh: BOs, CPU and
# GPU mappings, metadata, Linux 6.18's GEM_LIST_HANDLES, GET_MAPPING_INFO and CHANGE_HANDLE,
# an SDMA copy, dma-buf export and import, with and without KFD in the same process).
.PHONY: test-gem
test-gem: kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/rocm/gem-check.sh

# HIP programs built with Debian's hipcc for gfx908 and gfx90a, run unchanged on kfd-emu's
# shader engine under mi100 and mi210x4, each checking its own results (test/hip/run.sh).
.PHONY: test-hip
test-hip: kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/hip/run.sh

# Debian sid's ROCm 6.4 in a chroot (test/rocm64/chroot.sh: built once into build/rocm64/sid
# from the host's Debian archive) on kfd-emu speaking KFD 1.18 (test/rocm64/run.sh):
# rocminfo 7.2 and ROCr 6.4's SDMA copies on every profile, rocm-smi on mi210x4 and mi300x8,
# criu-rocm C/R of a ROCr 6.4 process (single GPU, another host, multi-GPU under supervise);
# HIP 6.4 programs on mi210x4 (gfx90a) and mi300x8 (gfx942) and C/R of a HIP 6.4 process
# with kernels in flight;
# every case counted as skipped when the archive cannot be reached.
.PHONY: test-rocm64
test-rocm64: $(BUILD)/criu-rocm kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) CRIU_TREE=$(CRIU_TREE) test/rocm64/run.sh $(BUILD)/criu-rocm

# Checkpoint/restore of HIP programs (test/hip-cr/run.sh): Debian's HIP 5.2 built as test-hip
# builds, dumped by criu-rocm with no options between kernels (right after hipInit, an MLP
# mid-training, streams, host memory, peer copies, two processes, a tree, a pre-dump, five
# cycles) and with kernels in flight (the MLP mid-kernel, spinners, a long kernel on every
# GPU, hipStreamWaitValue32), restored on the same host and on others; the MLP must end
# bit-identical.
.PHONY: test-hip-cr
test-hip-cr: $(BUILD)/criu-rocm kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/hip-cr/run.sh $(BUILD)/criu-rocm

# GPU checkpoint/restore end to end on kfd-emu (test/gpu/run.sh: dumps, faults, restores on
# other and incompatible hosts, damaged images, gpu-check).
.PHONY: test-gpu
test-gpu: $(BUILD)/criu-rocm $(BUILD)/crit kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) CRIT=$(TOP)/$(BUILD)/crit test/gpu/run.sh $(BUILD)/criu-rocm

# The SDMA copy path end to end on kfd-emu (test/sdma/run.sh): KFD's dma-buf fds and the
# render nodes' GEM/VM/CS served through `kfd-emu supervise`, criu-rocm with the SDMA engine
# forced; one dump->restore pass per case (CRIU under a seccomp filter cannot dump a process
# that has one), images identical to the CPU engine's, injected CS/WAIT_CS faults.
.PHONY: test-sdma
test-sdma: $(BUILD)/criu-rocm kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/sdma/run.sh $(BUILD)/criu-rocm

# GPU image integrity (test/integrity/run.py): ~700 seeded mutants of the GPU image files of
# four dumps (one with compressed pages files, two of shared-bo's GEM, shared-BO and dma-buf
# records), each refused by gpu-check and the restore for the same reason, or restored with every
# byte verified by the process; no image modified. A suite of its own, not a test-gpu case:
# one Python program with its own dump, its own table and a budget of its own (about a
# minute), run and counted apart in CI.
.PHONY: test-integrity
test-integrity: $(BUILD)/criu-rocm kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) $(PYTHON) test/integrity/run.py $(BUILD)/criu-rocm

# Checkpoint/restore of programs on Debian's libhsakmt and ROCr 5.2 (test/rocm/cr.sh: the zdtm
# tests gpu_hsakmt_* and gpu_rocr_* run on their own, dumped mid-work and restored on the same
# host, on other hosts and across swapped hives, five cycles, a tree of two).
.PHONY: test-rocm-cr
test-rocm-cr: $(BUILD)/criu-rocm kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/rocm/cr.sh $(BUILD)/criu-rocm

# GPU containers checkpointed and restored by runc (and crun, podman where they can),
# Docker and containerd with criu-rocm as their `criu` (test/containers/run.sh, with
# docker.sh and containerd.sh): on the same host, on another host, and into a container
# given other GPUs of the host.
.PHONY: test-containers
test-containers: $(BUILD)/criu-rocm kfd-tools $(CRUN_CRIU)/bin/crun
	CARGO_TARGET_DIR=$(CARGO_TARGET) CRUN=$(TOP)/$(CRUN_CRIU)/bin/crun test/containers/run.sh $(BUILD)/criu-rocm

# crun with CRIU (Debian's crun is built without it), from Debian's source package against
# this tree's libcriu (scripts/build-crun-criu.sh): test-containers' crun, and the crun a
# bookworm user gives podman (README). libcriu.sum changes only when the library or its
# headers do, so a rebuilt criu-rocm does not rebuild crun.
.PHONY: crun-criu
crun-criu: $(CRUN_CRIU)/bin/crun

$(CRUN_CRIU)/libcriu.sum: $(CRIU_TREE)/.lib-built
	rm -rf $(CRUN_CRIU)/libcriu
	$(TREE_LOCK) $(MAKE) -C $(CRIU_TREE) install-lib PREFIX=$(TOP)/$(CRUN_CRIU)/libcriu \
		LIBDIR=$(TOP)/$(CRUN_CRIU)/libcriu/lib INCLUDEDIR=$(TOP)/$(CRUN_CRIU)/libcriu/include \
		SKIP_PIP_INSTALL=1 CRIU_GPU_LIB=$(GPU_LIB) CRIU_ROCM_GITREV=$(GITREV) \
		>$(BUILD)/libcriu-install.log 2>&1 || { tail -n 20 $(BUILD)/libcriu-install.log; exit 1; }
	@cd $(CRUN_CRIU)/libcriu && sha256sum lib/libcriu.so.2 lib/pkgconfig/criu.pc include/criu/criu.h \
		include/criu/rpc.pb-c.h | cmp -s - $(TOP)/$@ || \
		sha256sum lib/libcriu.so.2 lib/pkgconfig/criu.pc include/criu/criu.h include/criu/rpc.pb-c.h >$(TOP)/$@

$(CRUN_CRIU)/bin/crun: $(CRUN_CRIU)/libcriu.sum scripts/build-crun-criu.sh scripts/lib/apt-source.sh
	scripts/build-crun-criu.sh $(CRUN_CRIU) >/dev/null

# CRIU's lib/ (pycriu for zdtm.py) from the same patched tree.
$(CRIU_TREE)/.lib-built: $(BUILD)/criu-rocm
	$(TREE_LOCK) $(MAKE) -C $(CRIU_TREE) -j$(JOBS) lib CRIU_GPU_LIB=$(GPU_LIB) CRIU_ROCM_GITREV=$(GITREV) \
		>$(BUILD)/criu-lib.log 2>&1 || { tail -n 40 $(BUILD)/criu-lib.log; exit 1; }
	touch $@

# crit, CRIU's image tool, from the same tree: its pycriu knows the GPU image files (patch
# 0013). build/crit runs it with Debian's python3 (python3-protobuf).
.PHONY: crit
crit: $(BUILD)/crit

$(BUILD)/crit: $(CRIU_TREE)/.lib-built
	$(TREE_LOCK) $(MAKE) -C $(CRIU_TREE) crit CRIU_GPU_LIB=$(GPU_LIB) CRIU_ROCM_GITREV=$(GITREV) \
		>$(BUILD)/criu-crit.log 2>&1 || { tail -n 40 $(BUILD)/criu-crit.log; exit 1; }
	printf '%s\n' '#!/bin/sh' '# crit from $(TOP)/$(CRIU_TREE) (written by make crit)' \
		'PYTHONPATH="$(TOP)/$(CRIU_TREE)/lib:$(TOP)/$(CRIU_TREE)/crit$${PYTHONPATH:+:$$PYTHONPATH}" exec $(PYTHON) -m crit "$$@"' \
		>$@.tmp && chmod +x $@.tmp && mv $@.tmp $@
	$@ --version >/dev/null
	@echo "built $@"

test-zdtm: $(BUILD)/criu-rocm $(CRIU_TREE)/.lib-built
	scripts/zdtm.sh --criu-bin $(BUILD)/criu-rocm --tree $(CRIU_TREE) --list test/zdtm-regression.list
	scripts/zdtm.sh --criu-bin $(BUILD)/criu-rocm --tree $(CRIU_TREE) --list test/zdtm-rocm.list

# The GPU zdtm tests (test/zdtm/static/gpu_*): each line of the list is one zdtm.py run inside
# its own kfd-emu machine. kfd-emu serves the GPUs; the tests link kfd-client's static library.
# First each test without C/R, intact (must pass) and with its GPU data damaged (must fail),
# then the list with checkpoint/restore.
.PHONY: kfd-tools test-zdtm-gpu
kfd-tools: FORCE
	cd rust && $(CARGO) build --release --locked -q -p kfd-emu -p kfd-client

ZDTM_GPU	:= scripts/zdtm-gpu.sh --criu-bin $(BUILD)/criu-rocm --tree $(CRIU_TREE) \
		   --list test/zdtm-gpu.list --kfd-emu $(CARGO_TARGET)/release/kfd-emu

test-zdtm-gpu: $(BUILD)/criu-rocm $(CRIU_TREE)/.lib-built kfd-tools
	$(ZDTM_GPU) --selftest
	$(ZDTM_GPU)

zdtm-compare: $(BUILD)/criu-rocm $(CRIU_TREE)/.lib-built $(BUILD)/stock/criu/criu
	scripts/zdtm-compare.sh $(BUILD)/stock/criu/criu $(BUILD)/criu-rocm $(CRIU_TREE) test/zdtm-regression.list

test-install: $(BUILD)/criu-rocm
	test/install/run.sh

# Upstream's AMD GPU plugin, built from the pinned tarball's plugins/amdgpu (which our
# patches leave untouched) in the same tree: test-rpc puts it in a plugin directory to
# check that criu-rocm skips it, under its own file name and under another.
UPSTREAM_PLUGIN	:= $(CRIU_TREE)/plugins/amdgpu/amdgpu_plugin.so
$(UPSTREAM_PLUGIN): $(BUILD)/criu-rocm
	$(TREE_LOCK) $(MAKE) -C $(CRIU_TREE) amdgpu_plugin CRIU_GPU_LIB=$(GPU_LIB) CRIU_ROCM_GITREV=$(GITREV) \
		>$(BUILD)/criu-amdgpu-plugin.log 2>&1 || { tail -n 40 $(BUILD)/criu-amdgpu-plugin.log; exit 1; }
	test -f $@

# criu-rocm as container engines run it: `criu swrk` spoken to over CRIU's RPC (VERSION,
# FEATURE_CHECK, DUMP and RESTORE of GPU processes), GPU knobs in configuration files
# (--gpu-knob), gpu-check's verdict in the RPC answer, upstream's amdgpu plugin and another
# plugin in the plugin directory (test/rpc/run.sh).
.PHONY: test-rpc
test-rpc: $(BUILD)/criu-rocm $(UPSTREAM_PLUGIN) kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) UPSTREAM_PLUGIN=$(TOP)/$(UPSTREAM_PLUGIN) CRIU_TREE=$(TOP)/$(CRIU_TREE) \
		test/rpc/run.sh $(BUILD)/criu-rocm

# Debian packages in build/deb/ (criu-rocm, criu-rocm-as-criu), built from source by
# dpkg-buildpackage in a scratch tree, offline, and linted (scripts/build-deb.sh).
.PHONY: deb
deb:
	JOBS=$(JOBS) CARGO="$(CARGO)" scripts/build-deb.sh

# The packages of `make deb` installed with apt on this machine, beside Debian's criu and
# in its place, used (version, check, VERSION RPC, dump and restore, crit on a GPU dump
# made on kfd-emu) and purged
# (test/package/run.sh; pycriu from the tree speaks the RPC).
.PHONY: test-package
test-package: deb $(CRIU_TREE)/.lib-built kfd-tools
	CARGO_TARGET_DIR=$(CARGO_TARGET) test/package/run.sh

install: $(BUILD)/criu-rocm $(BUILD)/criu-rocm.8
	install -D -m 0755 $(BUILD)/criu-rocm $(DESTDIR)$(BINDIR)/criu-rocm
	install -D -m 0644 $(BUILD)/criu-rocm.8 $(DESTDIR)$(MANDIR)/man8/criu-rocm.8

clean:
	rm -rf $(CRIU_TREE) $(BUILD)/stock $(BUILD)/criu-rocm $(BUILD)/crit $(BUILD)/gitrev $(BUILD)/deb
	cd rust && $(CARGO) clean

FORCE:
