/* cotrain client: serving pieces of held checkpoints (piece_server.h). */
#include "client/piece_server.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/cheat.h"
#include "shared/common/deadline.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"
#include "shared/peer/pieces.h"

#define ACCEPT_SLICE_MS 100 /* a detach waits at most this for the accept to return */
#define CONN_IDLE_MS 10000  /* between requests */
#define CONN_LIFE_MS 120000 /* a connection's whole life */
#define CONN_MAX_REQUESTS 4096

struct cl_piece_server {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	char project[128];
	int refs; /* the owner's and one per connection */
	int stop;
	/* the loan of the listener, and our reference to the identity */
	int attached, accepting, conns;
	listener *lst;
	peer_ctx *ctx;
	int64_t host_id;
	int64_t rate;         /* bytes/s, 0 = unlimited */
	int64_t next_free_ms; /* the rate limit: when the next piece may leave */
	struct {
		char sha[HASH_SHA256_HEX_LEN + 1];
		char path[4200];
		uint64_t size;
		unsigned long seq;
	} held[PIECE_SERVER_HELD];
	unsigned long seq;
};

static void unref(cl_piece_server *s)
{
	pthread_mutex_lock(&s->mu);
	int left = --s->refs;
	pthread_mutex_unlock(&s->mu);
	if (left)
		return;
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}

static cot_err open_held(void *arg, const char *sha, int *fd, uint64_t *size, cot_errbuf *eb)
{
	cl_piece_server *s = arg;
	char path[4200] = "";
	uint64_t want = 0;
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < PIECE_SERVER_HELD; i++)
		if (s->held[i].seq && strcmp(s->held[i].sha, sha) == 0) {
			snprintf(path, sizeof path, "%s", s->held[i].path);
			want = s->held[i].size;
		}
	pthread_mutex_unlock(&s->mu);
	struct stat st;
	*fd = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (*fd >= 0 && (fstat(*fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != want)) {
		close(*fd); /* trimmed from the cache, or replaced */
		*fd = -1;
	}
	if (*fd < 0)
		return cot_seterr(eb, COT_ERR_NOT_FOUND, "file %s is not held here", sha);
	*size = want;
	return COT_OK;
}

/* Wait for the rate limit, then (a test hook) corrupt the piece. */
static void before_send(void *arg, unsigned char *data, size_t len)
{
	cl_piece_server *s = arg;
	pthread_mutex_lock(&s->mu);
	int64_t now = deadline_now_ms(), at = now;
	if (s->rate > 0) {
		at = s->next_free_ms > now ? s->next_free_ms : now;
		s->next_free_ms = at + (int64_t)((double)len * 1000.0 / (double)s->rate);
	}
	pthread_mutex_unlock(&s->mu);
	if (at > now) {
		struct timespec ts = { (at - now) / 1000, (long)((at - now) % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	cl_cheat_piece(data, len);
}

typedef struct {
	cl_piece_server *s;
	peer_ctx *ctx;
	int fd;
	int64_t host_id;
} conn_arg;

static void *conn_main(void *arg)
{
	conn_arg *a = arg;
	cl_piece_server *s = a->s;
	peer_conn *c = NULL;
	cot_errbuf eb = { "", "" };
	int64_t deadline = deadline_after_ms(CONN_LIFE_MS);
	cot_err rc = peer_handshake(a->ctx, a->fd, PEER_SERVER, 0, deadline_after_ms(PIECES_HANDSHAKE_MS), &c,
	                            &eb);
	peer_ctx_free(a->ctx); /* our reference: the session needs it no more */
	uint32_t served = 0;
	int64_t peer = c ? peer_host_id(c) : 0;
	if (!rc) {
		pieces_serve_opts o = { .project = s->project,
			                .host_id = a->host_id,
			                .open_file = open_held,
			                .before_send = before_send,
			                .arg = s,
			                .idle_ms = CONN_IDLE_MS,
			                .max_requests = CONN_MAX_REQUESTS };
		rc = pieces_serve(c, &o, deadline, &served, &eb);
	}
	if (rc)
		log_info("project %s: pieces: %s%lld%s: %s (%u pieces served)", s->project,
		         peer ? "host " : "", (long long)peer, peer ? "" : " (unauthenticated)", eb.msg,
		         served);
	else if (served)
		log_info("project %s: pieces: served %u pieces to host %lld", s->project, served,
		         (long long)peer);
	peer_close(c);
	pthread_mutex_lock(&s->mu);
	s->conns--;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	free(a);
	unref(s);
	return NULL;
}

static void *accept_main(void *arg)
{
	cl_piece_server *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->stop && !s->attached)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->stop)
			break;
		listener *lst = s->lst;
		s->accepting = 1;
		pthread_mutex_unlock(&s->mu);
		int fd = -1;
		cot_errbuf eb = { "", "" };
		cot_err rc = listener_accept(lst, deadline_after_ms(ACCEPT_SLICE_MS), &fd, NULL, &eb);
		pthread_mutex_lock(&s->mu);
		s->accepting = 0;
		pthread_cond_broadcast(&s->cv);
		if (rc)
			continue;
		conn_arg *a = s->conns < PIECE_SERVER_CONNS ? malloc(sizeof *a) : NULL;
		if (!a) {
			close(fd); /* more connections than we serve at once */
			continue;
		}
		*a = (conn_arg){ .s = s, .ctx = peer_ctx_ref(s->ctx), .fd = fd, .host_id = s->host_id };
		s->conns++;
		s->refs++;
		pthread_t th;
		pthread_attr_t at;
		int ok = pthread_attr_init(&at) == 0;
		if (ok) {
			pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
			ok = pthread_create(&th, &at, conn_main, a) == 0;
			pthread_attr_destroy(&at);
		}
		if (!ok) {
			s->conns--;
			s->refs--;
			peer_ctx_free(a->ctx);
			free(a);
			close(fd);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

cl_piece_server *cl_piece_server_start(const char *project, cot_errbuf *eb)
{
	cl_piece_server *s = calloc(1, sizeof *s);
	if (!s) {
		cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	snprintf(s->project, sizeof s->project, "%s", project);
	s->refs = 1;
	if (pthread_create(&s->th, NULL, accept_main, s)) {
		cot_seterr(eb, COT_ERR_INTERNAL, "could not start the piece server's thread");
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
		return NULL;
	}
	return s;
}

void cl_piece_server_attach(cl_piece_server *s, listener *lst, peer_ctx *ctx, int64_t rate)
{
	if (!s || !lst || !ctx)
		return;
	pthread_mutex_lock(&s->mu);
	s->lst = lst;
	peer_ctx_free(s->ctx);
	s->ctx = peer_ctx_ref(ctx);
	s->host_id = peer_ctx_host_id(ctx);
	s->rate = rate > 0 ? rate : 0;
	s->attached = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void cl_piece_server_detach(cl_piece_server *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->attached = 0;
	while (s->accepting)
		pthread_cond_wait(&s->cv, &s->mu);
	s->lst = NULL;
	peer_ctx_free(s->ctx);
	s->ctx = NULL;
	pthread_mutex_unlock(&s->mu);
}

void cl_piece_server_hold(cl_piece_server *s, const char *sha256, const char *path, uint64_t size)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	int slot = 0;
	for (int i = 0; i < PIECE_SERVER_HELD; i++) {
		if (s->held[i].seq && strcmp(s->held[i].sha, sha256) == 0) {
			slot = i;
			break;
		}
		if (s->held[i].seq < s->held[slot].seq)
			slot = i;
	}
	snprintf(s->held[slot].sha, sizeof s->held[slot].sha, "%s", sha256);
	snprintf(s->held[slot].path, sizeof s->held[slot].path, "%s", path);
	s->held[slot].size = size;
	s->held[slot].seq = ++s->seq;
	pthread_mutex_unlock(&s->mu);
}

void cl_piece_server_stop(cl_piece_server *s)
{
	if (!s)
		return;
	cl_piece_server_detach(s);
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	unref(s);
}
