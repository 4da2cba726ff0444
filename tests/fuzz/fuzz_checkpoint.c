/* Fuzz harness: a model checkpoint as the client downloads it or the server
 * reads it back (kernels/checkpoint.c, ckpt_load_new).  The bytes are put in
 * an in-memory file (memfd) and loaded with max_batch 0, as the optimizer
 * side does.  What loads must be a model with finite parameters and
 * non-negative second moments; nothing else is promised. */
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/checkpoint.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-checkpoint", 0);
	if (fd < 0)
		return 0;
	size_t off = 0;
	while (off < size) {
		ssize_t w = write(fd, data + off, size - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	kern_model *m = NULL;
	cot_errbuf eb;
	if (off == size && ckpt_load_new(path, 0, &m, &eb) == COT_OK) {
		FUZZ_CHECK(m != NULL);
		size_t n = m->n_params;
		for (size_t i = 0; i < n; i++)
			FUZZ_CHECK(isfinite(m->params[i]) && isfinite(m->m[i]) && m->v[i] >= 0.0f);
		kern_model_free(m);
	}
	close(fd);
	return 0;
}
