/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * How the ROCm test programs of test/rocm report: one line a check, "ok   "
 * or "FAIL " and what was checked, counted for the summary line each
 * program prints last (run.sh reads the lines and the exit status).
 */
#ifndef CRIU_ROCM_TEST_REPORT_H
#define CRIU_ROCM_TEST_REPORT_H

#include <stdarg.h>
#include <stdio.h>

static int passed, failed;

static void report(const char *tag, const char *fmt, va_list ap)
{
	fputs(tag, stdout);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
}

__attribute__((format(printf, 1, 2))) static void pass(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report("ok   ", fmt, ap);
	va_end(ap);
	passed++;
}

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report("FAIL ", fmt, ap);
	va_end(ap);
	failed++;
}

#endif
