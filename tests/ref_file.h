/* cotrain tests: reference files written by PyTorch scripts
 * (tests/gen_torch_reference.py, tests/encoder_reference.py) for the C
 * tests to match.
 *
 * Format (little-endian): magic "CTREF001", uint32 record count, then per
 * record: uint32 name length, name, uint32 dtype (0 float32, 1 int32),
 * uint32 ndim (at most 4), uint32 shape[ndim], the data. */
#ifndef COT_TESTS_REF_FILE_H
#define COT_TESTS_REF_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	char name[128];
	int dtype; /* 0 float32, 1 int32 */
	int ndim;
	uint32_t shape[4];
	size_t n;
	void *data;
} ref_record;

/* Append the records of the file at path to the loaded set; bails out
 * (TAP) on a missing or malformed file. */
void ref_load(const char *path);

/* The record named "tag.what" of type dtype; bails out when absent or of
 * another type. */
const ref_record *ref_get(const char *tag, const char *what, int dtype);

/* max |a - b| / max |b| over n values (max |a - b| when b is all zero). */
double ref_rel_err(const float *a, const float *b, size_t n);

void ref_free_all(void);

#endif
