/* cotrain tests: the client's decisions, each through its seam: idleness
 * (loginctl output, terminal access times), mains or battery (fixture
 * /sys/class/power_supply folders), clock jumps (an injected wall and
 * monotonic time), the split of compute between projects by resource share,
 * and downloads against tests/fake_server.py: a corrupt file discarded and
 * fetched again, a file longer than announced or over the cap, a missing
 * one, the bandwidth cap honoured, and (as root, on a tiny tmpfs in a
 * private mount namespace) a full disk and a full state folder. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include "client/backoff.h"
#include "client/daemon.h"
#include "client/download.h"
#include "client/idle.h"
#include "client/power.h"
#include "client/spotcheck.h"
#include "client/state.h"
#include "shared/common/log.h"
#include "tests/tap.h"

static char dir[64];

static void put(const char *rel, const char *text)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s", dir, rel);
	char *slash = strrchr(path, '/');
	*slash = '\0';
	char cmd[600];
	snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
	if (system(cmd) != 0)
		bail_out("mkdir %s", path);
	*slash = '/';
	FILE *f = fopen(path, "w");
	if (!f)
		bail_out("could not write %s", path);
	fputs(text, f);
	fclose(f);
}

static void test_idle(void)
{
	double s = -1;
	double now_us = 1700000000e6;
	ok(cl_idle_parse_loginctl("IdleHint=no\nIdleSinceHint=0\n", now_us, &s) == 1 && s == 0,
	   "logind: IdleHint=no is active now");
	ok(cl_idle_parse_loginctl("IdleHint=yes\nIdleSinceHint=1699999700000000\n", now_us, &s) == 1 &&
	           s == 300,
	   "logind: idle since 300 s (%g)", s);
	ok(cl_idle_parse_loginctl("IdleSinceHint=1699999700000000\nIdleHint=yes\n", now_us, &s) == 1 &&
	           s == 300,
	   "logind: the order of the lines does not matter");
	ok(cl_idle_parse_loginctl("IdleHint=yes\nIdleSinceHint=0\n", now_us, &s) == 1 && s >= CL_IDLE_FOREVER,
	   "logind: a headless server with no sessions is idle for good");
	ok(cl_idle_parse_loginctl("IdleHint=yes\nIdleSinceHint=1800000000000000\n", now_us, &s) == 1 &&
	           s >= CL_IDLE_FOREVER,
	   "logind: a 'since' in the future (clock jump) counts as idle, not negative");
	ok(cl_idle_parse_loginctl("", now_us, &s) == 0, "logind: no output means no answer (fall back)");
	ok(cl_idle_parse_loginctl("Failed to connect to bus\n", now_us, &s) == 0,
	   "logind: an error message means no answer");
	ok(cl_idle_parse_loginctl("IdleHint=maybe\n", now_us, &s) == 0,
	   "logind: a bad value means no answer");

	/* terminals: the newest access time counts */
	char tty1[256], tty2[256], globs[600];
	put("dev/tty1", "");
	put("dev/pts/0", "");
	snprintf(tty1, sizeof tty1, "%s/dev/tty1", dir);
	snprintf(tty2, sizeof tty2, "%s/dev/pts/0", dir);
	time_t now = 1700000000;
	struct utimbuf u1 = { now - 1000, now - 1000 }, u2 = { now - 60, now - 60 };
	utime(tty1, &u1);
	utime(tty2, &u2);
	snprintf(globs, sizeof globs, "%s/dev/tty[0-9]* %s/dev/pts/[0-9]*", dir, dir);
	is_int((long long)cl_idle_tty_seconds(globs, now), 60, "tty: idle since the newest access (60 s)");
	snprintf(globs, sizeof globs, "%s/dev/tty[0-9]*", dir);
	is_int((long long)cl_idle_tty_seconds(globs, now), 1000, "tty: one terminal, 1000 s");
	is_int((long long)cl_idle_tty_seconds(globs, now - 2000), 0,
	       "tty: an access in the future is 0, not negative");
	snprintf(globs, sizeof globs, "%s/nothing/*", dir);
	ok(cl_idle_tty_seconds(globs, now) >= CL_IDLE_FOREVER, "tty: no terminals at all is idle");

	/* the configured source */
	cl_config c;
	cl_config_defaults(&c);
	c.idle_mode = IDLE_NONE;
	const char *src = NULL;
	ok(cl_idle_seconds(&c, &src) >= CL_IDLE_FOREVER && strcmp(src, "none") == 0,
	   "idle_detection none: idle");
	c.idle_mode = IDLE_TTY;
	snprintf(c.idle_tty_glob, sizeof c.idle_tty_glob, "%s/dev/pts/[0-9]*", dir);
	double idle = cl_idle_seconds(&c, &src);
	ok(strcmp(src, "tty") == 0 && idle > 60, "idle_detection tty reads the terminals (%.0f s)", idle);
}

static void test_power(void)
{
	char p[600];
	snprintf(p, sizeof p, "%s/ps-desktop", dir);
	if (mkdir(p, 0700) != 0)
		bail_out("mkdir");
	ok(cl_power_on_ac(p) == 1, "power: no supplies at all (a server) is mains");
	put("ps-laptop-ac/AC/type", "Mains\n");
	put("ps-laptop-ac/AC/online", "1\n");
	put("ps-laptop-ac/BAT0/type", "Battery\n");
	put("ps-laptop-ac/BAT0/status", "Charging\n");
	snprintf(p, sizeof p, "%s/ps-laptop-ac", dir);
	ok(cl_power_on_ac(p) == 1, "power: a laptop plugged in is on mains");
	put("ps-laptop-bat/ADP1/type", "Mains\n");
	put("ps-laptop-bat/ADP1/online", "0\n");
	put("ps-laptop-bat/BAT0/type", "Battery\n");
	snprintf(p, sizeof p, "%s/ps-laptop-bat", dir);
	ok(cl_power_on_ac(p) == 0, "power: a laptop unplugged is on battery");
	put("ps-bat-only/BAT1/type", "Battery\n");
	put("ps-bat-only/hid-mouse/type", "Battery\n");
	snprintf(p, sizeof p, "%s/ps-bat-only", dir);
	ok(cl_power_on_ac(p) == 0, "power: batteries and no mains supply is battery");
	put("ps-ups/ups/type", "UPS\n");
	snprintf(p, sizeof p, "%s/ps-ups", dir);
	ok(cl_power_on_ac(p) == 1, "power: only a UPS, no battery: mains");
	snprintf(p, sizeof p, "%s/no-such-dir", dir);
	ok(cl_power_on_ac(p) == 1, "power: no power_supply folder (a container) is mains");
}

/* A daemon with n projects and no threads, its state saved in sub. */
static void daemon_init(cl_daemon *d, const char *sub, int n)
{
	memset(d, 0, sizeof *d);
	cl_config_defaults(&d->cfg);
	snprintf(d->cfg.state_dir, sizeof d->cfg.state_dir, "%s/%s", dir, sub);
	if (mkdir(d->cfg.state_dir, 0700) != 0)
		bail_out("mkdir %s", d->cfg.state_dir);
	if (cl_state_init(&d->st))
		bail_out("out of memory");
	for (int i = 0; i < n; i++) {
		cl_project *p;
		cot_errbuf eb = { "", "" };
		if (cl_state_add(&d->st, &p, &eb))
			bail_out("cl_state_add: %s", eb.msg);
		snprintf(p->url, sizeof p->url, "http://h/projects/p%d", i);
		snprintf(p->name, sizeof p->name, "p%d", i);
		snprintf(p->base, sizeof p->base, "http://h");
		snprintf(p->host_token, sizeof p->host_token, "token12345");
		p->host_id = 1 + i;
		p->resource_share = 100;
		cl_backoff_init(&d->rt[i].bo, 1, 8);
	}
}

static void test_clock(void)
{
	cl_daemon d;
	daemon_init(&d, "clock", 2);
	d.st.projects[0].has_work = 1;
	d.st.projects[0].work.deadline = 1000000;
	cl_daemon_check_clock(&d, 500000, 100.0);
	cl_daemon_check_clock(&d, 500010, 110.0);
	is_int(d.st.projects[0].work.deadline, 1000000, "clock: no jump, deadline unchanged");
	/* the wall clock goes back an hour while 10 s pass */
	cl_daemon_check_clock(&d, 500020 - 3600, 120.0);
	is_int(d.st.projects[0].work.deadline, 1000000 - 3600,
	       "clock: back an hour, the deadline moves with it");
	is_int(d.st.projects[0].work.deadline - (500020 - 3600), 1000000 - 500020,
	       "clock: the time left to the deadline is unchanged");
	/* and forward a day */
	cl_daemon_check_clock(&d, 500030 - 3600 + 86400, 130.0);
	is_int(d.st.projects[0].work.deadline, 1000000 - 3600 + 86400,
	       "clock: forward a day, so is the deadline");
	is_int(d.st.projects[1].has_work, 0, "clock: a project without work is untouched");
	cl_daemon_check_clock(&d, 500040 - 3600 + 86400 + 20, 140.0);
	is_int(d.st.projects[0].work.deadline, 1000000 - 3600 + 86400,
	       "clock: drift under 30 s is not a jump");
	/* backoff runs on the monotonic clock: a wall jump does not touch it */
	double delay = cl_backoff_fail(&d.rt[0].bo, 140.0, 0.0);
	ok(!cl_backoff_ready(&d.rt[0].bo, 140.0 + delay / 2) && cl_backoff_ready(&d.rt[0].bo, 140.0 + delay),
	   "backoff: retry after %g s of monotonic time, whatever the wall clock does", delay);
	char st[PATH_MAX + 16];
	snprintf(st, sizeof st, "%s/state.json", d.cfg.state_dir);
	ok(access(st, F_OK) == 0, "clock: the moved deadlines were saved");
	cl_state_free(&d.st);
}

static void test_shares(void)
{
	cl_daemon d;
	daemon_init(&d, "shares", 2);
	d.st.projects[0].resource_share = 300;
	d.st.projects[1].resource_share = 100;
	int n[2] = { 0, 0 };
	for (int k = 0; k < 400; k++) {
		int i = cl_daemon_pick(&d, 0, 1000.0);
		if (i < 0 || i > 1)
			break;
		n[i]++;
		d.st.projects[i].cpu_seconds += 1.0; /* one slice of compute */
	}
	ok(n[0] + n[1] == 400, "shares: a project is picked every time");
	ok(n[0] >= 290 && n[0] <= 310 && n[1] >= 90 && n[1] <= 110, "shares 3:1 give a 3:1 split (%d:%d)",
	   n[0], n[1]);
	/* a project backing off waits; the other goes on */
	cl_backoff_fail(&d.rt[0].bo, 1000.0, 0.5);
	ok(cl_daemon_pick(&d, 0, 1000.1) == 1, "shares: a project in backoff is passed over");
	ok(cl_daemon_pick(&d, 1, 1000.1) == -1, "shares: paused, nothing is picked");
	/* a journaled finish goes first, even when paused */
	d.st.projects[1].has_work = 1;
	d.st.projects[1].work.pending_op = CL_REPORT_FINISH;
	d.st.projects[1].cpu_seconds = 1e6;
	ok(cl_daemon_pick(&d, 1, 1000.1) == 1, "shares: a journaled finish is sent even while paused");
	cl_state_free(&d.st);
}

/* tests/fake_server.py, started for the download tests. */
static pid_t fake_pid;
static int fake_port;
static char sha_small[65], sha_big[65];
static long long size_small, size_big;

static void fake_stop(void)
{
	if (fake_pid > 0) {
		kill(fake_pid, SIGTERM);
		waitpid(fake_pid, NULL, 0);
		fake_pid = 0;
	}
}

static int fake_start(void)
{
	const char *src = getenv("top_srcdir");
	char script[600], info[600];
	snprintf(script, sizeof script, "%s/tests/fake_server.py", src ? src : ".");
	snprintf(info, sizeof info, "%s/fake.json", dir);
	if (access(script, R_OK) != 0 || system("python3 -c '' 2>/dev/null") != 0)
		return 0;
	fake_pid = fork();
	if (fake_pid == 0) {
		execlp("python3", "python3", script, info, (char *)NULL);
		_exit(127);
	}
	atexit(fake_stop);
	for (int i = 0; i < 100 && access(info, F_OK) != 0; i++)
		usleep(100000);
	FILE *f = fopen(info, "r");
	if (!f)
		return 0;
	char buf[1024];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* {"port": N, "small": {"sha256": "...", "size": N}, "big": {...}} */
	char *s = strstr(buf, "\"small\""), *b = strstr(buf, "\"big\"");
	if (sscanf(buf, "{\"port\": %d", &fake_port) != 1 || !s || !b ||
	    sscanf(s, "\"small\": {\"sha256\": \"%64[0-9a-f]\", \"size\": %lld", sha_small, &size_small) !=
	            2 ||
	    sscanf(b, "\"big\": {\"sha256\": \"%64[0-9a-f]\", \"size\": %lld", sha_big, &size_big) != 2)
		return 0;
	return 1;
}

static cot_err fetch(const char *mode, const char *blob, const char *sha, long long size, long long max,
                     long long rate, const char *ddir, cot_errbuf *eb)
{
	char url[256], dest[600];
	snprintf(url, sizeof url, "http://127.0.0.1:%d/files/%s/%s", fake_port, mode, blob);
	snprintf(dest, sizeof dest, "%s/%s", ddir, sha);
	cl_download_req r = { .url = url,
		              .sha256 = sha,
		              .size = size,
		              .max_bytes = max,
		              .rate_limit = rate,
		              .timeout_s = 10,
		              .downloads_dir = ddir,
		              .dest_path = dest };
	eb->msg[0] = eb->hint[0] = '\0';
	return cl_download(&r, NULL, eb);
}

static void test_downloads(void)
{
	if (!fake_start()) {
		skip(9, "python3 and tests/fake_server.py are needed for the download tests");
		return;
	}
	char dl[600], part[700], dest[700];
	snprintf(dl, sizeof dl, "%s/dl", dir);
	snprintf(part, sizeof part, "%s/%s.part", dl, sha_small);
	snprintf(dest, sizeof dest, "%s/%s", dl, sha_small);
	cot_errbuf eb;
	cot_err rc = fetch("corrupt-once", "small", sha_small, size_small, 1 << 20, 0, dl, &eb);
	ok(rc == COT_ERR_CORRUPT && strstr(eb.msg, "sha256"), "a corrupt download is refused: %s", eb.msg);
	ok(access(part, F_OK) != 0 && access(dest, F_OK) != 0, "and its partial file discarded");
	rc = fetch("corrupt-once", "small", sha_small, size_small, 1 << 20, 0, dl, &eb);
	ok(rc == COT_OK && access(dest, F_OK) == 0, "fetched again, it is verified and installed: %s",
	   eb.msg);
	unlink(dest);
	rc = fetch("oversize", "small", sha_small, size_small, 1 << 20, 0, dl, &eb);
	ok(rc == COT_ERR_TOO_LARGE && strstr(eb.msg, "more than the 3000 bytes announced"),
	   "a file longer than announced is cut: %s", eb.msg);
	rc = fetch("good", "small", sha_small, size_small, 1000, 0, dl, &eb);
	ok(rc == COT_ERR_TOO_LARGE && strstr(eb.hint, "max_file_bytes"), "a file over the cap is refused: %s",
	   eb.msg);
	rc = fetch("missing", "small", sha_small, size_small, 1 << 20, 0, dl, &eb);
	ok(rc == COT_ERR_NOT_FOUND, "a missing file is 404: %s", eb.msg);
	/* the bandwidth cap: 2 MiB at 768 KiB/s (2.7 s nominal; curl lets the
	 * first bytes through at once) cannot take less than 1.5 s */
	double t0 = cl_now_mono();
	rc = fetch("good", "big", sha_big, size_big, 8 << 20, 768 << 10, dl, &eb);
	double t = cl_now_mono() - t0;
	ok(rc == COT_OK, "the big file downloads: %s", eb.msg);
	ok(t >= 1.5, "download_limit 768 KiB/s: 2 MiB took %.2f s (at least 1.5)", t);
	char big[700];
	snprintf(big, sizeof big, "%s/%s", dl, sha_big);
	unlink(big);
	t0 = cl_now_mono();
	rc = fetch("good", "big", sha_big, size_big, 8 << 20, 0, dl, &eb);
	diag("uncapped, the same file took %.2f s", cl_now_mono() - t0);
	unlink(big);
	ok(rc == COT_OK, "and without a cap too");
}

/* As root: a 256 KiB tmpfs in a private mount namespace. */
static void test_disk_full(void)
{
	char mnt[600];
	snprintf(mnt, sizeof mnt, "%s/tiny", dir);
	if (geteuid() != 0) {
		skip(7, "needs root to mount a tiny tmpfs");
		return;
	}
	if (mkdir(mnt, 0700) != 0 || unshare(CLONE_NEWNS) != 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0) {
		skip(7, "could not mount a tmpfs in a private mount namespace");
		return;
	}
	cl_daemon d;
	daemon_init(&d, "tiny/state", 1);
	ok(cl_daemon_save(&d) == COT_OK && !d.state_error, "disk: the state saves");
	char filler[700], dl[700];
	snprintf(filler, sizeof filler, "%s/filler", mnt);
	int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	static char zeros[4096];
	while (fd >= 0 && write(fd, zeros, sizeof zeros) > 0)
		;
	if (fd >= 0)
		close(fd);
	d.st.projects[0].cpu_seconds = 42;
	ok(cl_daemon_save(&d) == COT_ERR_IO && d.state_error,
	   "disk full: the save fails and the daemon knows");
	cl_state r;
	cot_errbuf eb = { "", "" };
	cl_state_init(&r);
	ok(cl_state_load(&r, d.cfg.state_dir, &eb) == COT_OK && r.nprojects == 1 &&
	           r.projects[0].cpu_seconds == 0,
	   "disk full: the old state is intact %s", eb.msg);
	cl_state_free(&r);
	snprintf(dl, sizeof dl, "%s/dl", mnt);
	if (fake_pid > 0) {
		cot_err rc = fetch("good", "big", sha_big, size_big, 8 << 20, 0, dl, &eb);
		ok(rc == COT_ERR_IO && strstr(eb.hint, "Free disk space"),
		   "disk full: a download stops with a clear message: %s %s", eb.msg, eb.hint);
	} else {
		skip(1, "python3 and tests/fake_server.py are needed for the download tests");
	}
	unlink(filler);
	ok(cl_daemon_save(&d) == COT_OK && !d.state_error, "space freed: the state saves again");
	if (mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0) {
		eb.msg[0] = '\0';
		ok(cl_state_save(&d.st, d.cfg.state_dir, &eb) == COT_ERR_IO && strstr(eb.msg, "Read-only"),
		   "read-only folder: the save fails with a clear message: %s", eb.msg);
		cl_state_init(&r);
		ok(cl_state_load(&r, d.cfg.state_dir, &eb) == COT_OK && r.projects[0].cpu_seconds == 42,
		   "read-only folder: the last good state is there");
		cl_state_free(&r);
	} else {
		skip(2, "could not remount the tmpfs read-only");
	}
	umount2(mnt, MNT_DETACH);
	cl_state_free(&d.st);
}

/* The shards a spot check downloads are picked by the token positions of
 * its range (cl_spot_token_runs).  The server's numbers pass the client's
 * bounds one by one (seq_len and microbatch_size up to 2^20, mb_per_epoch
 * up to 2^50) while their product reaches 2^90: the position of
 * microbatch 2^24 + 1 of such an epoch, 2^64 + 2^40, wrapped modulo 2^64 to
 * 2^40, and the check fetched the shards of another part of the stream. */
static void test_spot_runs(void)
{
	cl_project p;
	memset(&p, 0, sizeof p);
	cot_errbuf eb = { "", "" };
	uint64_t f[2], l[2];
	p.seq_len = 128;
	p.microbatch_size = 8;
	p.mb_per_epoch = 1000;
	ok(cl_spot_token_runs(&p, 2010, 2013, f, l, &eb) == 1 && f[0] == 10 * 1024 && l[0] == 13 * 1024,
	   "a spot check of microbatches [2010, 2013) reads tokens 10240 to 13312 of the stream");
	ok(cl_spot_token_runs(&p, 1998, 2001, f, l, &eb) == 2 && f[0] == 998 * 1024 && l[0] == 1000 * 1024 &&
	           f[1] == 0 && l[1] == 1024,
	   "a range that passes an epoch's end reads its end and its start");
	p.seq_len = 1 << 20;
	p.microbatch_size = 1 << 20;
	p.mb_per_epoch = 1LL << 50;
	int64_t lo = (1LL << 24) + 1;
	uint64_t wrapped = (uint64_t)lo * (uint64_t)(p.microbatch_size * p.seq_len); /* the old arithmetic */
	ok(wrapped == 1ULL << 40, "the old arithmetic wraps for such a project (%llu, not 2^64 + 2^40)",
	   (unsigned long long)wrapped);
	ok(cl_spot_token_runs(&p, lo, lo + 1, f, l, &eb) == -1 && strstr(eb.msg, "does not fit"),
	   "a project whose positions overflow is refused, not wrapped: %s", eb.msg);
	p.seq_len = 128;
	p.microbatch_size = 8;
	p.mb_per_epoch = 1000;
	ok(cl_spot_token_runs(&p, 5, 5, f, l, &eb) == -1 &&
	           cl_spot_token_runs(&p, 5, 1006, f, l, &eb) == -1 &&
	           cl_spot_token_runs(&p, -1, 3, f, l, &eb) == -1,
	   "an empty range, one longer than an epoch and a negative one are refused: %s", eb.msg);
}

int main(void)
{
	plan_lazy();
	cot_log_set_level(COT_LOG_ERROR);
	snprintf(dir, sizeof dir, "/tmp/cotrain-clunits-XXXXXX");
	if (!mkdtemp(dir))
		bail_out("mkdtemp");
	test_idle();
	test_power();
	test_clock();
	test_shares();
	test_downloads();
	test_disk_full();
	test_spot_runs();
	fake_stop();
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		diag("could not remove %s", dir);
	done_testing();
	return exit_status();
}
