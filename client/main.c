/* cotrain-client: the volunteer daemon.
 *
 *   cotrain-client [-c FILE] [--state-dir DIR] [--socket PATH]
 *                  [--log-level LEVEL] [--set KEY=VALUE]...
 *
 * Runs in the foreground (under systemd, or a terminal); logs to stderr.
 * SIGTERM and SIGINT stop it cleanly (the state is saved); SIGKILL loses at
 * most the microbatches computed since the last save, never a report.
 * Exit status: 0 after a clean stop, 1 when it cannot start (the message
 * says why), 2 for bad usage. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "config.h"
#include "client/benchmark.h"
#include "client/cheat.h"
#include "client/close_watch.h"
#include "client/control.h"
#include "client/daemon.h"
#include "client/hostinfo.h"
#include "client/logring.h"
#include "client/priority.h"
#include "kernels/backend.h"
#include "kernels/gpu.h"
#include "shared/common/fault.h"
#include "shared/common/hash.h"
#include "shared/common/log.h"
#include "shared/common/options.h"

/* The command line: the file to read, then the keys to set over it, in
 * their order (the file is read only once the whole line is known). */
#define MAX_SETS 256
typedef struct {
	const char *config;
	int nset;
	const char *key[MAX_SETS]; /* NULL: --set, val holds "KEY\0VALUE" */
	char *val[MAX_SETS];       /* owned: freed by apply_sets */
} client_cli;

/* Remember KEY=VALUE (spec->key names the key for -d, -s, -l; --set has
 * none and splits its argument). */
static cot_err remember(void *settings, const opt_spec *o, const char *arg, cot_errbuf *eb)
{
	client_cli *cli = settings;
	if (cli->nset == MAX_SETS)
		return cot_seterr(eb, COT_ERR_INVALID, "too many settings on the command line (at most %d)",
		                  MAX_SETS);
	char *v = strdup(arg);
	if (!v)
		return cot_seterr(eb, COT_ERR_NOMEM, "out of memory");
	if (!o->key) { /* --set: "KEY\0VALUE" in v */
		char *eq = strchr(v, '=');
		if (!eq) {
			free(v);
			return cot_seterr(eb, COT_ERR_INVALID, "--set needs KEY=VALUE, not \"%s\"", arg);
		}
		*eq = '\0';
	}
	cli->key[cli->nset] = o->key;
	cli->val[cli->nset++] = v;
	return COT_OK;
}

/* Set the remembered keys over the file's, in order; frees them.  COT_OK or
 * the first refusal in eb. */
static cot_err apply_sets(client_cli *cli, cl_config *cfg, cot_errbuf *eb)
{
	cot_err rc = COT_OK;
	for (int i = 0; i < cli->nset; i++) {
		const char *key = cli->key[i] ? cli->key[i] : cli->val[i];
		const char *val = cli->key[i] ? cli->val[i] : cli->val[i] + strlen(cli->val[i]) + 1;
		if (!rc)
			rc = cl_config_set(cfg, key, val, eb);
		free(cli->val[i]);
	}
	cli->nset = 0;
	return rc;
}

#define F(field) offsetof(client_cli, field)
static const opt_spec client_opts[] = {
	{ "config", 'c', OPT_STRING, F(config), .metavar = "FILE",
	  .help = "configuration file (default " CL_DEFAULT_CONFIG
	          "; a missing default file means built-in defaults)" },
	{ "state-dir", 'd', OPT_CALL, .set = remember, .key = "state_dir", .metavar = "DIR",
	  .help = "state folder (default " CL_DEFAULT_STATE ")" },
	{ "socket", 's', OPT_CALL, .set = remember, .key = "socket", .metavar = "PATH",
	  .help = "control socket (default STATE_DIR/control.sock)" },
	{ "log-level", 'l', OPT_CALL, .set = remember, .key = "log_level", .metavar = "LEVEL",
	  .help = "debug, info, warn or error" },
	{ "set", 0, OPT_CALL, .set = remember, .metavar = "KEY=VALUE",
	  .help = "any configuration key, after the file" },
	{ "help", 'h', OPT_HELP, .help = "this help" },
	{ "version", 'V', OPT_VERSION, .help = "the version" },
	{ NULL }
};
#undef F

static const opt_program client_prog = {
	.prog = "cotrain-client",
	.synopsis = "[OPTION]...",
	.intro = "Compute for cotrain projects in the background, at idle priority.\n",
	.outro = "Control it with cotrainctl.  See doc/client.md.\n",
	.opts = client_opts,
};

static int fatal(const char *what, const cot_errbuf *eb)
{
	log_error("%s: %s", what, eb->msg);
	if (eb->hint[0])
		log_error("hint: %s", eb->hint);
	return 1;
}

/* The GPUs this client may compute on (logged, named in the host's
 * hardware), and the speed of the one the preferences pick: a GPU faster
 * than the CPU is what the host reports, so the server sizes work units to
 * it.  Without one, the reason is logged once and kept for status. */
static void find_gpus(cl_daemon *d)
{
	d->gpus = kern_gpu_count(d->gpu_why, sizeof d->gpu_why);
	if (d->gpus <= 0) {
		log_info("no GPU: %s; computing on the CPU", d->gpu_why);
		return;
	}
	const kern_gpu_api *api = kern_gpu_api_get(NULL, 0);
	size_t len = 0;
	for (int g = 0; g < d->gpus; g++) {
		kern_gpu_info info;
		char err[200] = "";
		if (api->device_info(g, &info, err, sizeof err)) {
			log_warn("GPU %d: %s", g, err);
			continue;
		}
		log_info("GPU %d: %s, compute capability %d.%d, %.1f GiB; %s", g, info.name, info.cc_major,
		         info.cc_minor, (double)info.mem_total / (1 << 30), api->describe());
		len += (size_t)snprintf(d->hw.gpu + len, len < sizeof d->hw.gpu ? sizeof d->hw.gpu - len : 0,
		                        "%s%s (%.0f GiB)", g ? ", " : "", info.name,
		                        (double)info.mem_total / (1 << 30));
		if (len >= sizeof d->hw.gpu)
			len = sizeof d->hw.gpu - 1;
	}
	cl_prefs p;
	cl_daemon_prefs(d, &p);
	int dev = (int)p.v[PREF_GPU_DEVICE] < d->gpus ? (int)p.v[PREF_GPU_DEVICE] : 0;
	cot_errbuf eb = { "", "" };
	double f = cl_benchmark_gpu(dev, d->cfg.benchmark_seconds, &eb);
	if (f <= 0) {
		log_warn("GPU %d benchmark failed: %s", dev, eb.msg);
		return;
	}
	log_info("GPU %d benchmark: %.3g FLOP/s (fp32 products)", dev, f);
	if (p.v[PREF_USE_GPU] && f > d->hw.flops)
		d->hw.flops = f;
}

int main(int argc, char **argv)
{
	kern_blas_reexec_if_needed(argc, argv); /* first: may re-exec with a faster BLAS core */
	cot_log_set_ident("cotrain-client");
	static cl_daemon d;
	cl_config_defaults(&d.cfg);
	client_cli cli = { 0 };
	opt_result orc = opt_parse(&client_prog, argc, argv, &cli, NULL);
	if (orc) {
		apply_sets(&cli, &d.cfg, &(cot_errbuf){ "", "" }); /* frees them */
		return orc == OPT_EXIT ? 0 : 2;
	}
	/* The file first, then the command line over it. */
	cot_errbuf eb = { "", "" };
	cot_err rc = cl_config_load(&d.cfg, cli.config ? cli.config : CL_DEFAULT_CONFIG, &eb);
	if (rc && !(rc == COT_ERR_NOT_FOUND && !cli.config)) {
		apply_sets(&cli, &d.cfg, &(cot_errbuf){ "", "" });
		return fatal("cannot read the configuration", &eb);
	}
	rc = apply_sets(&cli, &d.cfg, &eb);
	if (rc) {
		fprintf(stderr, "cotrain-client: %s\n", eb.msg);
		return 2;
	}
	rc = cl_config_finish(&d.cfg, &eb);
	if (rc)
		return fatal("bad configuration", &eb);
	cot_log_set_level((cot_log_level)d.cfg.log_level);
	rc = fault_init(&eb); /* a test hook, off unless COTRAIN_FAULT is set */
	if (!rc)
		rc = cl_cheat_init(&eb); /* a test hook, off unless COTRAIN_CHEAT is set */
	if (rc)
		return fatal("bad test hook", &eb);

	/* Threads a library started at load time compute too: idle them now,
	 * before our own threads exist. */
	cl_priority_idle_others();

	if (mkdir(d.cfg.state_dir, 0750) < 0 && errno != EEXIST) {
		cot_seterr(&eb, COT_ERR_IO, "could not create state directory \"%s\": %s", d.cfg.state_dir,
		           strerror(errno));
		cot_sethint(&eb, "Create it and make it writable by the user the client runs as.");
		return fatal("cannot start", &eb);
	}
	char lockpath[PATH_MAX];
	if (snprintf(lockpath, sizeof lockpath, "%s/lock", d.cfg.state_dir) >= (int)sizeof lockpath ||
	    snprintf(d.cache_dir, sizeof d.cache_dir, "%s/cache", d.cfg.state_dir) >=
	            (int)sizeof d.cache_dir ||
	    snprintf(d.downloads_dir, sizeof d.downloads_dir, "%s/downloads", d.cfg.state_dir) >=
	            (int)sizeof d.downloads_dir)
		return fatal("cannot start", &(cot_errbuf){ "state directory path is too long", "" });
	int lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lockfd < 0) {
		cot_seterr(&eb, COT_ERR_IO, "state directory \"%s\" is not writable: %s", d.cfg.state_dir,
		           strerror(errno));
		cot_sethint(&eb, "Make it writable by the user the client runs as, or choose another with "
		                 "--state-dir.");
		return fatal("cannot start", &eb);
	}
	if (flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		cot_seterr(&eb, COT_ERR_EXISTS, "another cotrain-client uses state directory \"%s\"",
		           d.cfg.state_dir);
		return fatal("cannot start", &eb);
	}

	if (cl_logring_start(&eb))
		log_warn("%s; \"cotrainctl log\" will show nothing", eb.msg);
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (cl_state_init(&d.st))
		return fatal("cannot start", &(cot_errbuf){ "out of memory", "" });
	rc = cl_state_load(&d.st, d.cfg.state_dir, &eb);
	if (rc)
		return fatal("cannot load the state", &eb);
	if (eb.msg[0]) {
		log_error("%s", eb.msg);
		if (eb.hint[0])
			log_error("hint: %s", eb.hint);
		eb.msg[0] = eb.hint[0] = '\0';
	}
	/* The machine's identity, drawn once and kept across detach and attach. */
	if (!d.st.machine_secret[0] && hash_random_token(32, d.st.machine_secret, sizeof d.st.machine_secret))
		return fatal("cannot start", &(cot_errbuf){ "could not draw a random machine secret", "" });
	/* Prove the folder takes writes now, not at the first report. */
	rc = cl_state_save(&d.st, d.cfg.state_dir, &eb);
	if (rc)
		return fatal("cannot save the state", &eb);

	cl_hostinfo_read(&d.hw);
	char fp[65];
	cl_hostinfo_fingerprint(&d.hw, fp);
	if (d.st.bench_flops <= 0 || strcmp(fp, d.st.bench_hw) != 0) {
		log_info("benchmarking this host (%s, %d cores) for %d s", d.hw.cpu_model, d.hw.cores,
		         d.cfg.benchmark_seconds);
		cl_prefs p;
		cl_daemon_prefs(&d, &p);
		double f = cl_benchmark(cl_prefs_threads(&p, d.hw.cores), d.cfg.benchmark_seconds, &eb);
		if (f > 0) {
			d.st.bench_flops = f;
			snprintf(d.st.bench_hw, sizeof d.st.bench_hw, "%s", fp);
			d.st.bench_at = (int64_t)time(NULL);
			log_info("benchmark: %.3g FLOP/s", f);
			cl_state_save(&d.st, d.cfg.state_dir, &eb);
		} else {
			log_warn("benchmark failed: %s", eb.msg);
		}
	}
	d.hw.flops = d.st.bench_flops;
	find_gpus(&d);
	d.idle_since = (int64_t)time(NULL);

	curl_global_init(CURL_GLOBAL_DEFAULT);
	pthread_mutex_init(&d.lock, NULL);
	pthread_cond_init(&d.wake, NULL);
	for (int i = 0; i < CL_MAX_PROJECTS; i++)
		cl_backoff_init(&d.rt[i].bo, d.cfg.retry_base, d.cfg.retry_max);

	cl_control *ctl;
	rc = cl_control_start(d.cfg.socket, d.cfg.socket_group, cl_commands_handle, &d, &ctl, &eb);
	if (rc)
		return fatal("cannot open the control socket", &eb);
	pthread_t worker;
	if (pthread_create(&worker, NULL, cl_daemon_worker, &d) != 0) {
		cl_control_stop(ctl);
		return fatal("cannot start", &(cot_errbuf){ "could not start the worker thread", "" });
	}
	cl_close_watch *watch = NULL;
	if (cl_close_watch_start(&d, &watch, &eb))
		log_warn("%s: the round's close comes with heartbeats only", eb.msg);
	log_info("cotrain-client %s started: state %s, socket %s, %d project(s) attached", PACKAGE_VERSION,
	         d.cfg.state_dir, d.cfg.socket, d.st.nprojects);

	for (;;) {
		int sig = 0;
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGHUP) {
			log_info("SIGHUP: nothing to reload; use cotrainctl prefs to change preferences");
			continue;
		}
		log_info("stopping on signal %d", sig);
		break;
	}
	pthread_mutex_lock(&d.lock);
	d.stop = 1;
	d.interrupt = 1;
	pthread_cond_broadcast(&d.wake);
	pthread_mutex_unlock(&d.lock);
	pthread_join(worker, NULL);
	cl_close_watch_stop(watch);
	cl_daemon_rounds_wait(&d, 30);
	cl_control_stop(ctl);
	pthread_mutex_lock(&d.lock);
	cl_daemon_save(&d);
	for (int i = 0; i < d.st.nprojects; i++) {
		if (d.rt[i].round_running)
			continue; /* a round still ending owns them */
		cl_compute_close(d.rt[i].session);
		cl_piece_server_stop(d.rt[i].pieces);
		cl_peer_free(&d.rt[i].peer);
	}
	pthread_mutex_unlock(&d.lock);
	cl_state_free(&d.st);
	curl_global_cleanup();
	log_info("stopped");
	close(lockfd);
	return 0;
}
