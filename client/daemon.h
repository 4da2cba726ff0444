/* cotrain client: the daemon's shared data, its work loop and its control
 * commands.
 *
 * One worker thread (daemon.c) does everything that touches the servers
 * and the CPU, one project step at a time: send a journaled report, ask
 * for work, download files, compute microbatches, heartbeat, finish or hand
 * back.  The control thread (commands.c) answers cotrainctl.  Both take
 * d->lock to read or change d->st; neither holds it across network calls or
 * compute.  Every change worth keeping is saved with cl_state_save before
 * the daemon acts on it. */
#ifndef CL_DAEMON_H
#define CL_DAEMON_H

#include <pthread.h>

#include "client/api.h"
#include "client/backoff.h"
#include "client/compute.h"
#include "client/conf.h"
#include "client/peer_id.h"
#include "client/piece_server.h"
#include "client/state.h"

#define CL_ROUND_MAX_UNITS 256

/* The work units of one version whose microbatches [lo, lo + mb) are in a
 * session's gradient sum, with the summed microbatch losses; a unit
 * reported to a round that then reopened for the rest of its batch is
 * marked, as the server keeps its report (doc/design.md).  Memory only:
 * after a restart the gradient is gone, so nothing of it is reported (the
 * server drops what is not reported and hands it out again). */
typedef struct {
	int n;
	struct {
		int64_t id, lo, mb; /* the unit, its first microbatch, how many are summed */
		double loss_sum;
		int reported; /* in a round that reopened for the rest: not again */
	} u[CL_ROUND_MAX_UNITS];
} cl_round_acc;

/* What the daemon knows of a project that is not saved. */
typedef struct {
	cl_backoff bo;
	char activity[400];    /* shown by status */
	double sps;            /* samples per second, recent */
	int download_failures; /* of the current work unit */
	cl_compute *session;   /* the model of session_version, pointed at work unit session_wu */
	int64_t session_version;
	char session_ckpt[65]; /* the server's checkpoint the session's model equals ("" for the
	                            * seed's initial model): its work units must name the same */
	int64_t session_wu;
	cl_round_acc acc; /* the work units whose microbatches the session's gradient sums */
	int round_due;    /* the round of round_version closed: take part */
	int64_t round_version, round_attempt;
	int64_t round_spread_ms; /* its "report_spread_ms": report after a random part of it */
	cl_peer peer;            /* identity and listener for averaging */
	cl_piece_server *pieces; /* serves held checkpoints on peer's listener between rounds */
	char network[200];       /* how the NAT service sees us (cl_peer_network), for status */
	char links[600];         /* the last round's connections (cl_links_summary), for status */
	int round_running;       /* a round thread owns the session, the peer and the live unit */
	int close_watch_off;     /* the server has no close notice (client/close_watch.h) */
	double last_report;      /* monotonic seconds */
	double last_account_check;
	double next_spot_at;      /* monotonic seconds of the next spot-check pass */
	double last_spot_end;     /* monotonic seconds the last pass ended */
	struct cl_spot_job *spot; /* a check computed in part, for the next pass */
	/* The host's credit as the server last said (cl_api_host_credit). */
	double credit_granted, credit_pending;
	int64_t credit_at;     /* unix seconds of that answer, 0 = none yet */
	double next_credit_at; /* monotonic seconds of the next look */
} cl_runtime;

typedef struct {
	cl_config cfg;
	char cache_dir[PATH_MAX], downloads_dir[PATH_MAX];
	cl_hostinfo hw;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	volatile int stop;
	cl_state st;                    /* under lock */
	cl_runtime rt[CL_MAX_PROJECTS]; /* parallel to st.projects, under lock */
	char paused[160];               /* why compute waits, "" when it runs */
	const char *idle_source;
	int threads;
	int state_error; /* the last save failed */
	int64_t last_wall;
	double last_mono;
	volatile int interrupt; /* compute should stop at the next microbatch */
	/* The work unit being computed right now and its microbatches done,
	 * updated after each one without the lock (status reads them). */
	volatile int64_t computing_wu, computing_mb;
	cl_compute *computing; /* the session in use outside the lock, or NULL */
	int rounds_running;    /* round threads (daemon_round.c) */
	int64_t idle_since;    /* unix seconds this host last stopped computing or averaging */
	int gpus;              /* usable GPUs found at start (kernels/gpu.h) */
	char gpu_why[200];     /* with none: why ("no usable CUDA driver: ...") */
} cl_daemon;

/* Effective preferences: defaults < account < config file < local. */
void cl_daemon_prefs(cl_daemon *d, cl_prefs *out);

/* Save d->st (lock held).  Logs and records a failure; returns it. */
cot_err cl_daemon_save(cl_daemon *d);

/* Remove project i and its runtime (lock held). */
void cl_daemon_remove_project(cl_daemon *d, int i);

/* The work loop; returns when d->stop is set. */
void *cl_daemon_worker(void *arg);

/* Decide again why compute must wait (d->paused: the state cannot be
 * saved, suspended by the user, on battery, the user active; "" when it may
 * run) and the compute threads, from the state and the effective
 * preferences, and show it in each project's activity ("suspended: WHY"
 * while paused, unless the project backs off; cleared when the pause ends).
 * The worker calls it on every turn; a control command that changes what it
 * depends on calls it too, so that status is true the moment the command
 * has answered, not only once the worker comes round (lock held). */
void cl_daemon_update_paused(cl_daemon *d);

/* Wake the worker (after attach, resume, prefs...). */
void cl_daemon_kick(cl_daemon *d);

/* The activity of a project while the worker answers its spot checks. */
#define SPOT_ACTIVITY "answering spot checks"

/* t (unix seconds) as the local time of day "HH:MM:SS", for status. */
void cl_daemon_clock_text(int64_t t, char *buf, size_t len);

/* Show what project i does now, for status (lock held). */
void cl_daemon_activity(cl_daemon *d, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Close project i's session and forget its gradient (lock held): a work
 * unit whose microbatches it sums was handed back, expired or refused, so
 * the sum no longer matches what the server counts. */
void cl_daemon_drop_gradient(cl_daemon *d, int i, const char *why);

/* Take part in the round d->rt[i].round_version (daemon_round.c): report the
 * work units of the version, average within the group the server plans,
 * step, report the outcome; on success the session holds version v+1 and
 * an empty gradient.  Lock held on entry and exit, released while waiting
 * on the network or computing.  Runs in a thread of its own (the worker
 * goes on with other projects) while rt->round_running is set; nothing else
 * touches that project's session meanwhile. */
void cl_daemon_round(cl_daemon *d, int i);

/* Lend project i's peer listener and identity, when it has them, to its
 * piece server (started on first use; client/piece_server.h) until the
 * next round or prefetch takes them (cl_piece_server_detach).  Lock held. */
void cl_daemon_pieces_lend(cl_daemon *d, int i);

/* Take note of the "round" an answer about project i's work carries (a
 * heartbeat's, a finish's, a refusal's, the close notice's): once the round
 * of the session's version is not open and the session holds a gradient,
 * the round is due and compute stops at the next microbatch (lock held). */
void cl_daemon_note_round(cl_daemon *d, int i, const json_t *answer);

/* Start the round of project i in its own thread (lock held). */
void cl_daemon_round_start(cl_daemon *d, int i);

/* Wait up to timeout_s for running rounds to end (lock not held). */
void cl_daemon_rounds_wait(cl_daemon *d, double timeout_s);

/* The index of the project with this URL, or -1 (lock held). */
int cl_daemon_find(cl_daemon *d, const char *url);

/* The API options from the effective preferences. */
void cl_daemon_api_opts(cl_daemon *d, cl_api_opts *o);

/* Detect a jump of the wall clock against the monotonic one between the
 * last call and this one (wall: unix seconds now, mono: cl_now_mono() now;
 * passed in so tests can jump) and, beyond 30 s, move every deadline by the
 * jump so that it neither expires nor extends work; the state is saved then.
 * Backoff needs nothing: it runs on the monotonic clock.  Lock held. */
void cl_daemon_check_clock(cl_daemon *d, int64_t wall, double mono);

/* The scheduling decision at monotonic time now: the next project to serve,
 * -1 when none may act.  A journaled finish or hand-back whose backoff has
 * passed comes first; otherwise (unless paused) the project with the least
 * cpu_seconds per unit of its resource share, among those whose backoff has
 * passed or whose current work unit can go on from the cache.  Lock held. */
int cl_daemon_pick(cl_daemon *d, int paused, double now);

/* The control command handler (commands.c), for cl_control_start. */
json_t *cl_commands_handle(const json_t *req, void *ctx, cot_err *rc, cot_errbuf *eb);

#endif
