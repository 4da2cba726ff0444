/* cotrain client: in-memory tail of the log (see logring.h). */
#include "client/logring.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_BYTES 2048

static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static char *ring[CL_LOGRING_LINES];
static int ring_next, ring_count;
static int out_fd = -1, in_fd = -1;

static void ring_push(const char *line, size_t len)
{
	char *copy = malloc(len + 1);
	if (!copy)
		return;
	memcpy(copy, line, len);
	copy[len] = '\0';
	pthread_mutex_lock(&ring_lock);
	free(ring[ring_next]);
	ring[ring_next] = copy;
	ring_next = (ring_next + 1) % CL_LOGRING_LINES;
	if (ring_count < CL_LOGRING_LINES)
		ring_count++;
	pthread_mutex_unlock(&ring_lock);
}

static void *reader(void *arg)
{
	(void)arg;
	char buf[LINE_BYTES * 2];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(in_fd, buf + have, sizeof buf - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		ssize_t w = write(out_fd, buf + have, (size_t)n);
		(void)w;
		have += (size_t)n;
		size_t start = 0;
		for (size_t i = 0; i < have; i++)
			if (buf[i] == '\n') {
				ring_push(buf + start, i - start);
				start = i + 1;
			}
		if (start == 0 && have == sizeof buf) { /* an overlong line */
			ring_push(buf, have);
			start = have;
		}
		memmove(buf, buf + start, have - start);
		have -= start;
	}
	return NULL;
}

cot_err cl_logring_start(cot_errbuf *eb)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return cot_seterr(eb, COT_ERR_IO, "could not create the log pipe: %s", strerror(errno));
	out_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	if (out_fd < 0) {
		close(p[0]);
		close(p[1]);
		return cot_seterr(eb, COT_ERR_IO, "could not duplicate stderr: %s", strerror(errno));
	}
	in_fd = p[0];
	pthread_t t;
	if (pthread_create(&t, NULL, reader, NULL) != 0) {
		close(p[0]);
		close(p[1]);
		close(out_fd);
		return cot_seterr(eb, COT_ERR_IO, "could not start the log thread");
	}
	pthread_detach(t);
	dup2(p[1], STDERR_FILENO);
	close(p[1]);
	return COT_OK;
}

json_t *cl_logring_tail(int n)
{
	json_t *a = json_array();
	if (!a)
		return NULL;
	pthread_mutex_lock(&ring_lock);
	if (n > ring_count)
		n = ring_count;
	if (n < 0)
		n = 0;
	for (int i = 0; i < n; i++) {
		int idx = (ring_next - n + i + CL_LOGRING_LINES) % CL_LOGRING_LINES;
		json_array_append_new(a, json_string(ring[idx] ? ring[idx] : ""));
	}
	pthread_mutex_unlock(&ring_lock);
	return a;
}
