/* Fuzz harness: a safetensors file as it comes from a download or a
 * maintainer's disk (kernels/safetensors.c, st_parse).  What parses must
 * describe tensors that lie inside the buffer, with nbytes = numel x the
 * dtype's size, findable by name. */
#include <string.h>

#include "kernels/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	st_file *f = NULL;
	cot_errbuf eb;
	if (st_parse(data, size, &f, &eb)) {
		FUZZ_CHECK(f == NULL);
		return 0;
	}
	size_t n = st_count(f);
	FUZZ_CHECK(n <= ST_MAX_TENSORS);
	for (size_t i = 0; i < n; i++) {
		const st_tensor *t = st_tensor_at(f, i);
		FUZZ_CHECK(t && t->name && strlen(t->name) <= ST_NAME_MAX);
		FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
		FUZZ_CHECK(st_dtype_size(t->dtype) > 0 && t->nbytes == t->numel * st_dtype_size(t->dtype));
		size_t numel = 1;
		for (int d = 0; d < t->ndim; d++)
			numel *= (size_t)t->shape[d];
		FUZZ_CHECK(numel == t->numel);
		const uint8_t *p = t->data;
		FUZZ_CHECK(t->nbytes == 0 || (p >= data && p + t->nbytes <= data + size));
		FUZZ_CHECK(st_find(f, t->name) == t);
		/* Touch every byte, so ASan checks the bounds. */
		volatile uint8_t sum = 0;
		(void)sum;
		for (size_t b = 0; b < t->nbytes; b++)
			sum += p[b];
	}
	const char *v = st_meta(f, "format");
	if (v)
		(void)strlen(v);
	st_close(f);
	return 0;
}
