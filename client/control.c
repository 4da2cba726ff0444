/* cotrain client: the control socket server (see control.h). */
#include "client/control.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shared/common/deadline.h"
#include "shared/common/log.h"

struct cl_control {
	int fd;
	int stop_pipe[2];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	cl_ctl_handler handler;
	void *ctx;
	pthread_t thread;
};

json_t *cl_ctl_error_json(cot_err rc, const cot_errbuf *eb)
{
	json_t *err = json_pack("{s:s, s:s}", "code", cot_strerror(rc), "message",
	                        eb && eb->msg[0] ? eb->msg : cot_strerror(rc));
	if (err && eb && eb->hint[0])
		json_object_set_new(err, "hint", json_string(eb->hint));
	return json_pack("{s:b, s:o}", "ok", 0, "error", err);
}

static void send_json(int fd, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	const char *out =
	        s ? s : "{\"ok\":false,\"error\":{\"code\":\"nomem\",\"message\":\"out of memory\"}}";
	size_t len = strlen(out), off = 0;
	while (off < len) {
		ssize_t n = send(fd, out + off, len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	(void)!send(fd, "\n", 1, MSG_NOSIGNAL);
	free(s);
}

/* Read one request line within the time and size bounds: the whole line
 * within CL_CTL_TIMEOUT_S of the connection (bytes do not push the time
 * on).  Returns the length, or -1 with rc/eb set. */
static long read_request(int fd, char *buf, size_t cap, cot_err *rc, cot_errbuf *eb)
{
	size_t have = 0;
	int64_t deadline = deadline_after_ms(CL_CTL_TIMEOUT_S * 1000);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, deadline_left_ms(deadline));
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr == 0) {
			*rc = cot_seterr(eb, COT_ERR_TIMEOUT,
			                 "control request not received within %d seconds", CL_CTL_TIMEOUT_S);
			return -1;
		}
		ssize_t n = recv(fd, buf + have, cap - have, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			*rc = cot_seterr(eb, COT_ERR_IO, "could not read control request: %s",
			                 strerror(errno));
			return -1;
		}
		if (n == 0)
			return (long)have; /* EOF ends the request too */
		char *nl = memchr(buf + have, '\n', (size_t)n);
		have += (size_t)n;
		if (nl)
			return (long)(nl - buf);
		if (have == cap) {
			*rc = cot_seterr(eb, COT_ERR_TOO_LARGE, "control request is larger than %d bytes",
			                 CL_CTL_MAX_REQUEST);
			return -1;
		}
	}
}

static void serve_one(cl_control *c, int fd)
{
	char *buf = malloc(CL_CTL_MAX_REQUEST);
	cot_errbuf eb = { "", "" };
	cot_err rc = COT_OK;
	json_t *answer = NULL;
	if (!buf) {
		rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		goto out;
	}
	long len = read_request(fd, buf, CL_CTL_MAX_REQUEST, &rc, &eb);
	if (len < 0)
		goto out;
	json_error_t jerr;
	json_t *req = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
	if (!req || !json_is_object(req)) {
		rc = cot_seterr(&eb, COT_ERR_INVALID, "malformed control request: %s",
		                req ? "not a JSON object" : jerr.text);
		cot_sethint(&eb, "Send one JSON object such as {\"cmd\": \"status\"} followed by a newline.");
		json_decref(req);
		goto out;
	}
	if (!json_is_string(json_object_get(req, "cmd"))) {
		rc = cot_seterr(&eb, COT_ERR_INVALID, "control request has no string field \"cmd\"");
		json_decref(req);
		goto out;
	}
	answer = c->handler(req, c->ctx, &rc, &eb);
	json_decref(req);
	if (answer && !rc)
		json_object_set_new(answer, "ok", json_true());
out:
	if (!answer || rc) {
		json_decref(answer);
		if (!rc)
			rc = cot_seterr(&eb, COT_ERR_NOMEM, "out of memory");
		answer = cl_ctl_error_json(rc, &eb);
		log_info("control request failed: %s", eb.msg);
	}
	send_json(fd, answer);
	json_decref(answer);
	free(buf);
	/* Read what the peer still sends (for at most a second), so closing
	 * does not reset the connection before it has read the answer. */
	shutdown(fd, SHUT_WR);
	char sink[4096];
	int64_t until = deadline_after_ms(1000);
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = deadline_left_ms(until);
		if (left == 0 || poll(&p, 1, left < 200 ? left : 200) <= 0 ||
		    recv(fd, sink, sizeof sink, 0) <= 0)
			break;
	}
}

static void *serve(void *arg)
{
	cl_control *c = arg;
	for (;;) {
		struct pollfd p[2] = { { .fd = c->fd, .events = POLLIN },
			               { .fd = c->stop_pipe[0], .events = POLLIN } };
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_error("control socket: poll failed: %s", strerror(errno));
			break;
		}
		if (p[1].revents)
			break;
		int fd = accept4(c->fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		struct ucred cred;
		socklen_t cl = sizeof cred;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
			log_debug("control connection from uid %d pid %d", (int)cred.uid, (int)cred.pid);
		serve_one(c, fd);
		close(fd);
	}
	return NULL;
}

cot_err cl_control_start(const char *path, const char *group, cl_ctl_handler h, void *ctx, cl_control **out,
                         cot_errbuf *eb)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return cot_seterr(eb, COT_ERR_TOO_LARGE,
		                  "control socket path \"%s\" is longer than %zu bytes", path,
		                  sizeof sa.sun_path - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);

	/* A live daemon answers; a stale file refuses. */
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0) {
		if (connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0) {
			close(probe);
			cot_seterr(eb, COT_ERR_EXISTS, "another cotrain-client is listening on \"%s\"", path);
			cot_sethint(eb, "Stop it first, or give this one another state_dir and socket.");
			return COT_ERR_EXISTS;
		}
		close(probe);
	}
	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return cot_seterr(eb, COT_ERR_EXISTS, "\"%s\" exists and is not a socket", path);
		unlink(path);
	}

	cl_control *c = calloc(1, sizeof *c);
	if (!c)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	c->handler = h;
	c->ctx = ctx;
	memcpy(c->path, sa.sun_path, sizeof c->path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || pipe2(c->stop_pipe, O_CLOEXEC) < 0) {
		cot_seterr(eb, COT_ERR_IO, "could not create the control socket: %s", strerror(errno));
		goto fail;
	}
	/* Bound under a temporary name with no permissions for others, opened
	 * to the group, listening, and only then renamed into place: a client
	 * that finds the socket can connect (between bind and listen it would
	 * be refused). */
	struct sockaddr_un tmp = { .sun_family = AF_UNIX };
	if (snprintf(tmp.sun_path, sizeof tmp.sun_path, "%s.%ld", path, (long)getpid()) >=
	    (int)sizeof tmp.sun_path) {
		cot_seterr(eb, COT_ERR_TOO_LARGE,
		           "control socket path \"%s\" is too long for its temporary name", path);
		goto fail;
	}
	unlink(tmp.sun_path);
	mode_t old = umask(0177);
	int b = bind(c->fd, (struct sockaddr *)&tmp, sizeof tmp);
	umask(old);
	if (b < 0 || listen(c->fd, 16) < 0) {
		cot_seterr(eb, COT_ERR_IO, "could not listen on control socket \"%s\": %s", tmp.sun_path,
		           strerror(errno));
		if (b == 0)
			unlink(tmp.sun_path);
		goto fail;
	}
	struct group gr, *grp = NULL;
	char gbuf[4096];
	int shared = 0;
	if (group && group[0] && getgrnam_r(group, &gr, gbuf, sizeof gbuf, &grp) == 0 && grp) {
		shared = chown(tmp.sun_path, (uid_t)-1, grp->gr_gid) == 0 && chmod(tmp.sun_path, 0660) == 0;
		if (!shared)
			log_warn("could not give control socket \"%s\" to group \"%s\": %s; only its owner "
			         "may control the client",
			         path, group, strerror(errno));
	}
	if (rename(tmp.sun_path, path) != 0) {
		cot_seterr(eb, COT_ERR_IO, "could not create control socket \"%s\": %s", path,
		           strerror(errno));
		unlink(tmp.sun_path);
		goto fail;
	}
	if (shared)
		log_info("control socket %s: owner and group \"%s\" may control the client", path, group);
	else if (!grp)
		log_info("control socket %s: group \"%s\" does not exist, so only the owner (and root) may "
		         "control the client",
		         path, group ? group : "");
	if (pthread_create(&c->thread, NULL, serve, c) != 0) {
		cot_seterr(eb, COT_ERR_IO, "could not start the control thread");
		unlink(path);
		goto fail;
	}
	*out = c;
	return COT_OK;
fail:
	if (c->fd >= 0)
		close(c->fd);
	if (c->stop_pipe[0] > 0) {
		close(c->stop_pipe[0]);
		close(c->stop_pipe[1]);
	}
	free(c);
	return COT_ERR_IO;
}

void cl_control_stop(cl_control *c)
{
	if (!c)
		return;
	(void)!write(c->stop_pipe[1], "x", 1);
	pthread_join(c->thread, NULL);
	close(c->fd);
	close(c->stop_pipe[0]);
	close(c->stop_pipe[1]);
	unlink(c->path);
	free(c);
}
