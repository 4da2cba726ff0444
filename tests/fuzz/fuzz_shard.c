/* Fuzz harness: a dataset shard as the client downloads it
 * (shared/common/shard.c, shard_read): a gzip'd tar of shard.json and
 * tokens.u8.  The bytes are put in an in-memory file (memfd).  What is
 * accepted must hold exactly n_tokens tokens, at most the limit asked. */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shared/common/shard.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("fuzz-shard", 0);
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
	shard_meta meta;
	unsigned char *tokens = NULL;
	cot_errbuf eb;
	if (off == size && shard_read(path, 1u << 20, &meta, &tokens, &eb) == COT_OK) {
		FUZZ_CHECK(meta.n_tokens <= (1u << 20) && shard_name_valid(meta.dataset));
		volatile unsigned char sum = 0;
		(void)sum;
		for (uint64_t i = 0; i < meta.n_tokens; i++)
			sum += tokens[i];
		free(tokens);
	} else {
		FUZZ_CHECK(tokens == NULL);
	}
	close(fd);
	return 0;
}
