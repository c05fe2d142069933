/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Rounds for criu-rocm's zdtm tests on ROCm (gpu_rocr_*, gpu_hsakmt_*):
 * besides zdtm's SIGTERM ("check now, then end"), SIGUSR1 asks for a round
 * ("check now, and go on"): the test checks its GPU state, runs new work,
 * and writes "round N: ok" (or "round N: FAIL") to its output. zdtm.py
 * never sends SIGUSR1; test/rocm/cr.sh does after every restore, to see
 * that the restored process goes on working before the next checkpoint.
 */
#ifndef ZDTM_GPU_ROUND_H
#define ZDTM_GPU_ROUND_H

/*
 * Handles SIGUSR1 from now on: call it before test_daemon(). `who` names
 * the process in the round lines ("round N (who): ok") when a test has
 * several, else NULL. 0 or -1.
 */
int gpu_rounds_init(const char *who);

/*
 * Waits for zdtm's SIGTERM like test_waitsig(), running round(arg, n) for
 * every SIGUSR1 meanwhile (n = 1, 2, ...). round() returns 0 or -1 (after
 * fail()). Returns -1 if any round failed, else 0.
 */
int gpu_wait_rounds(int (*round)(void *arg, unsigned int n), void *arg);

#endif /* ZDTM_GPU_ROUND_H */
