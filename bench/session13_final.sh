#!/usr/bin/env bash
# The thirteenth session's last device call, most needed first: the CUDA exact-rows default checked
# (bench/batch_validate_session.sh: ds4-cuda device tests, engine batch tests, batched decode), then
# the wgpu A/B of the Q2_K unit and the one-thread Sinkhorn against 88c7440 (bench/ab_session.sh:
# wgpu tests on the GPU, kernel_bench interleaved, Vulkan decode/prefill interleaved; no profiles, no MTP).
# Binaries: BASE=88c7440 bench/build_ab_bins.sh plus engine-batch-tests in device-bin/bins.tar.xz.
bash bench/batch_validate_session.sh 2>&1 | tail -30
NO_PROFILE=1 MTP_BEFORE_S=0 bash bench/ab_session.sh > /tmp/ab.txt 2>&1; tail -30 /tmp/ab.txt
