/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - shared helpers of the libFuzzer harnesses in tests/fuzz
 * (docs/reliability.md, "Fuzzing").
 *
 * Each harness fuzz_NAME.c defines LLVMFuzzerTestOneInput() for one parser
 * or decoder of the core and, beyond what AddressSanitizer and
 * UndefinedBehaviorSanitizer catch, checks what the module's contract
 * promises about an input it accepts (FUZZ_CHECK): a broken promise aborts,
 * which libFuzzer reports as a crash with the input saved.  Harnesses run
 * single-threaded; their only state is set up once in
 * LLVMFuzzerInitialize().
 */
#ifndef CKPT_FUZZ_H
#define CKPT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Abort with the condition, where, and a formatted reason when cond is false. */
#define FUZZ_CHECK(cond, ...)                                                          \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__,    \
				__LINE__, #cond);                                      \
			fprintf(stderr, __VA_ARGS__);                                  \
			fputc('\n', stderr);                                           \
			abort();                                                       \
		}                                                                      \
	} while (0)

/* The core's warnings about damaged input are expected by the thousand:
 * only errors are written. */
static inline void fuzz_quiet(void)
{
	ckpt_log_set_level(CKPT_LOG_ERR);
}

/* A NUL-terminated copy of data[0..size) (the caller frees it); NULL when
 * out of memory. */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (s) {
		memcpy(s, data, size);
		s[size] = '\0';
	}
	return s;
}

/* An error message of the core is one printable line. */
static inline void fuzz_check_err_line(const char *err)
{
	for (const unsigned char *p = (const unsigned char *)err; *p; p++)
		FUZZ_CHECK(*p >= 0x20 && *p != 0x7f, "control byte 0x%02x in \"%s\"", *p, err);
}

#endif
