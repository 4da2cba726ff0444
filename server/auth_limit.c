/* cotrain-server: the price of a password (see auth_limit.h). */
#include "server/auth_limit.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define BUCKETS 4096 /* client addresses remembered; the oldest goes first */

typedef struct {
	char ip[48];
	double tokens;
	double at; /* monotonic seconds of the last refill */
} bucket;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t freed = PTHREAD_COND_INITIALIZER;
static bucket buckets[BUCKETS];
static int hashing;

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The bucket of ip (mu held): found, or the one least recently refilled,
 * taken over full. */
static bucket *bucket_of(const char *ip, double now, double burst)
{
	bucket *oldest = &buckets[0];
	for (int i = 0; i < BUCKETS; i++) {
		if (strcmp(buckets[i].ip, ip) == 0)
			return &buckets[i];
		if (buckets[i].at < oldest->at)
			oldest = &buckets[i];
	}
	snprintf(oldest->ip, sizeof oldest->ip, "%s", ip);
	oldest->tokens = burst;
	oldest->at = now;
	return oldest;
}

auth_limit_verdict auth_limit_take(http_req *req, int *retry_after)
{
	char ip[48];
	http_client_ip(req, ip, sizeof ip);
	double now = now_s(), rate = req->cfg->auth_per_minute;
	pthread_mutex_lock(&mu);
	bucket *b = rate > 0 ? bucket_of(ip, now, rate) : NULL;
	if (b) {
		b->tokens += (now - b->at) * rate / 60.0;
		if (b->tokens > rate)
			b->tokens = rate;
		b->at = now;
	}
	if (b && b->tokens < 1) {
		*retry_after = (int)((1 - b->tokens) * 60.0 / rate) + 1;
		pthread_mutex_unlock(&mu);
		return AUTH_LIMIT_RATE;
	}
	if (b)
		b->tokens -= 1;
	int cap = req->cfg->threads > 1 ? req->cfg->threads - 1 : 1;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += AUTH_WAIT_MS / 1000;
	until.tv_nsec += (long)(AUTH_WAIT_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	while (hashing >= cap)
		if (pthread_cond_timedwait(&freed, &mu, &until) != 0)
			break;
	bool ok = hashing < cap;
	if (ok)
		hashing++;
	pthread_mutex_unlock(&mu);
	*retry_after = 1;
	return ok ? AUTH_LIMIT_OK : AUTH_LIMIT_BUSY;
}

bool auth_limit_enter(http_req *req)
{
	int wait = 0;
	auth_limit_verdict v = auth_limit_take(req, &wait);
	if (v == AUTH_LIMIT_OK)
		return true;
	char ra[16];
	snprintf(ra, sizeof ra, "%d", wait);
	if (v == AUTH_LIMIT_RATE)
		http_reply_error(req, 429, "too_many_requests",
		                 "too many log-ins or sign-ups from this address",
		                 "Wait for the time Retry-After says, then try again.");
	else
		http_reply_error(req, 503, "unavailable", "the server is busy with other log-ins",
		                 "Try again in a moment.");
	http_add_header(req, "Retry-After", ra);
	return false;
}

void auth_limit_leave(void)
{
	pthread_mutex_lock(&mu);
	hashing--;
	pthread_cond_signal(&freed);
	pthread_mutex_unlock(&mu);
}
