// What the test/hip programs share: a check macro that names the call and HIP's error.
#pragma once
#include <hip/hip_runtime.h>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                          \
	do {                                                                                  \
		hipError_t e_ = (x);                                                              \
		if (e_ != hipSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,                    \
				hipGetErrorString(e_));                                                   \
			exit(1);                                                                      \
		}                                                                                 \
	} while (0)

#define FAIL(...)                                                                         \
	do {                                                                                  \
		fprintf(stderr, __VA_ARGS__);                                                     \
		fputc('\n', stderr);                                                              \
		exit(1);                                                                          \
	} while (0)
