/* Fuzz harness: the client daemon's control socket (client/control.c) as a
 * local user's program speaks to it.  One control thread serves a socket in
 * a temporary folder for the whole run, with a handler that answers "echo"
 * and refuses anything else; each input is sent as one connection's bytes
 * (the end of the input ends the request) and the answer read back.  Every
 * answer, whatever was sent, must be one JSON object with a boolean "ok". */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "client/control.h"
#include "tests/fuzz/fuzz.h"

static json_t *handler(const json_t *req, void *ctx, cot_err *rc, cot_errbuf *eb)
{
	const char *cmd = json_string_value(json_object_get(req, "cmd"));
	if (cmd && strcmp(cmd, "echo") == 0)
		return json_pack("{s:O?}", "args", json_object_get(req, "args"));
	*rc = cot_seterr(eb, COT_ERR_INVALID, "unknown command \"%.32s\"", cmd ? cmd : "");
	return NULL;
}

static char sock_dir[64], sock_path[108];
static cl_control *ctl;

/* At exit: stop the thread, remove the socket and its folder. */
static void stop(void)
{
	cl_control_stop(ctl);
	rmdir(sock_dir);
}

static bool start(void)
{
	static int state; /* 0: not yet, 1: serving, -1: could not */
	if (state)
		return state > 0;
	cot_errbuf eb;
	state = -1;
	snprintf(sock_dir, sizeof sock_dir, "/tmp/cotrain-fuzz-ctl-XXXXXX");
	if (!mkdtemp(sock_dir))
		return false;
	snprintf(sock_path, sizeof sock_path, "%s/ctl", sock_dir);
	if (cl_control_start(sock_path, "nogroup-cotrain-fuzz", handler, NULL, &ctl, &eb)) {
		fprintf(stderr, "fuzz_control: %s\n", eb.msg);
		rmdir(sock_dir);
		return false;
	}
	atexit(stop);
	state = 1;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > CL_CTL_MAX_REQUEST + 1024 || !start())
		return 0;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	size_t off = 0;
	while (off < size) {
		ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR) /* libFuzzer's timer signal */
			continue;
		if (w <= 0)
			break; /* the daemon stopped reading (a complete or oversized request) */
		off += (size_t)w;
	}
	shutdown(fd, SHUT_WR);
	static char answer[1 << 20];
	size_t n = 0;
	for (;;) {
		ssize_t r = recv(fd, answer + n, sizeof answer - 1 - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	json_t *a = json_loadb(answer, n, 0, NULL);
	FUZZ_CHECK(json_is_object(a) && json_is_boolean(json_object_get(a, "ok")));
	json_decref(a);
	return 0;
}
