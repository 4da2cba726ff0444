/* cotrain tests: what the fuzz harnesses of tests/fuzz/ share.
 *
 * Each harness is one file defining LLVMFuzzerTestOneInput over one parser
 * of outside bytes.  Built with --enable-fuzzing it links libFuzzer's main;
 * otherwise tests/fuzz/replay.c's, which runs it over its corpus. */
#ifndef COT_TESTS_FUZZ_H
#define COT_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property the parser promises (a round trip, a bound on what it
 * returns): when it fails the harness aborts, which libFuzzer reports as a
 * crash and the replay as a failed test. */
#define FUZZ_CHECK(cond) \
	do { \
		if (!(cond)) { \
			fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

#endif
