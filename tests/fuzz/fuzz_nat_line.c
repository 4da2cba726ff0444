/* Fuzz harness: the NAT service's line protocol as either side reads it
 * (shared/nat/nat_line.c, nat_line_read; the client reads the service's
 * answers with it, server/relay.c holds requests to the same NAT_LINE_MAX).
 * The input is written into a socket pair whose far end is then closed,
 * and read line by line until the reader stops.  Every line returned must
 * be NUL-terminated within NAT_LINE_MAX with no "\n" in it. */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/common/deadline.h"
#include "shared/nat/nat_line.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 16384) /* well inside a socket buffer: the write never blocks */
		return 0;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 0;
	size_t off = 0;
	while (off < size) {
		ssize_t w = write(sv[1], data + off, size - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	close(sv[1]);
	char line[NAT_LINE_MAX];
	cot_errbuf eb;
	for (int i = 0; i <= (int)size; i++) {
		if (nat_line_read(sv[0], line, deadline_after_ms(1000), NULL, &eb) != COT_OK)
			break;
		size_t n = strnlen(line, NAT_LINE_MAX);
		FUZZ_CHECK(n < NAT_LINE_MAX && !memchr(line, '\n', n));
	}
	close(sv[0]);
	return 0;
}
