/* cotrainctl: control a running cotrain-client over its local socket.
 *
 *   cotrainctl [--socket PATH] [--json] COMMAND [ARG]...
 *
 * Exit status: 0 success; 1 the daemon refused the command (its message is
 * printed); 2 bad usage; 3 the daemon is not running (no socket, or nobody
 * listening); 4 permission denied on the socket (not the daemon's user,
 * root, or in its group).  With --json the daemon's answer is printed as
 * JSON on stdout, errors included, and the exit status is the same. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "config.h"
#include "shared/common/options.h"

#define DEFAULT_SOCKET "/run/cotrain-client/control.sock"
#define ANSWER_MAX (4 << 20)

enum { EX_OK = 0, EX_REFUSED = 1, EX_USAGE = 2, EX_NOTRUNNING = 3, EX_PERM = 4 };

/* Send req, read the answer.  Returns the answer or NULL with *ex set. */
static json_t *call(const char *path, json_t *req, int *ex)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path) {
		fprintf(stderr, "cotrainctl: socket path \"%s\" is too long\n", path);
		*ex = EX_USAGE;
		return NULL;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (e == EACCES || e == EPERM) {
			fprintf(stderr,
			        "cotrainctl: permission denied on \"%s\"\n"
			        "hint: only the daemon's user, root and members of its group (usually "
			        "cotrain) may control it\n",
			        path);
			*ex = EX_PERM;
		} else {
			fprintf(stderr,
			        "cotrainctl: could not connect to cotrain-client at \"%s\": %s\n"
			        "hint: is the daemon running?  Start it with \"systemctl start "
			        "cotrain-client\", or pass --socket\n",
			        path, strerror(e));
			*ex = EX_NOTRUNNING;
		}
		return NULL;
	}
	char *s = json_dumps(req, JSON_COMPACT);
	size_t len = s ? strlen(s) : 0, off = 0;
	while (s && off < len) {
		ssize_t n = send(fd, s + off, len - off, MSG_NOSIGNAL);
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	(void)!send(fd, "\n", 1, MSG_NOSIGNAL);
	free(s);
	char *buf = malloc(ANSWER_MAX + 1);
	size_t have = 0;
	while (buf && have < ANSWER_MAX) {
		ssize_t n = recv(fd, buf + have, ANSWER_MAX - have, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	close(fd);
	json_t *a = buf ? json_loadb(buf, have, 0, NULL) : NULL;
	free(buf);
	if (!json_is_object(a)) {
		fprintf(stderr, "cotrainctl: the daemon sent no valid answer\n");
		json_decref(a);
		*ex = EX_NOTRUNNING;
		return NULL;
	}
	*ex = json_is_true(json_object_get(a, "ok")) ? EX_OK : EX_REFUSED;
	return a;
}

static void fmt_duration(double s, char *out, size_t len)
{
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(out, len, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
	else if (t >= 60)
		snprintf(out, len, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(out, len, "%lds", t);
}

static void print_status(const json_t *a)
{
	const char *act = json_string_value(json_object_get(a, "activity"));
	printf("activity: %s\n", act ? act : "unknown (a daemon older than this cotrainctl)");
	printf("threads: %lld, benchmark: %.3g GFLOP/s\n",
	       (long long)json_integer_value(json_object_get(a, "threads")),
	       json_number_value(json_object_get(a, "benchmark_flops")) / 1e9);
	const char *dev = json_string_value(json_object_get(a, "compute_device"));
	if (dev)
		printf("computes on: %s\n", dev);
	const char *nogpu = json_string_value(json_object_get(a, "gpu_none"));
	if (nogpu)
		printf("GPU: none (%s)\n", nogpu);
	const json_t *projects = json_object_get(a, "projects");
	if (json_array_size(projects) == 0)
		printf("no project attached; attach one with \"cotrainctl attach URL --key KEY\"\n");
	size_t i;
	const json_t *p;
	json_array_foreach(projects, i, p)
	{
		printf("\nproject %s (%s), host %lld, share %g\n",
		       json_string_value(json_object_get(p, "name")),
		       json_string_value(json_object_get(p, "url")),
		       (long long)json_integer_value(json_object_get(p, "host_id")),
		       json_number_value(json_object_get(p, "resource_share")));
		printf("  %s\n", json_string_value(json_object_get(p, "activity")));
		const char *net = json_string_value(json_object_get(p, "network"));
		const char *links = json_string_value(json_object_get(p, "links"));
		if (net && *net)
			printf("  network: %s\n", net);
		if (links && *links)
			printf("  last round's connections: %s\n", links);
		printf("  microbatches reported in all: %lld\n",
		       (long long)json_integer_value(json_object_get(p, "mb_total")));
		const json_t *cr = json_object_get(p, "credit");
		if (json_is_object(cr))
			printf("  credit: %.6g granted, %.6g pending\n",
			       json_number_value(json_object_get(cr, "granted")),
			       json_number_value(json_object_get(cr, "pending")));
		else
			printf("  credit: not known yet (asked of the server after each finished work "
			       "unit)\n");
		const json_t *w = json_object_get(p, "work");
		if (!json_is_object(w))
			continue;
		long long done = json_integer_value(json_object_get(w, "mb_done"));
		long long total = json_integer_value(json_object_get(w, "mb_total"));
		double sps = json_number_value(json_object_get(w, "samples_per_sec"));
		const json_t *eta = json_object_get(w, "eta_seconds");
		char bar[31], left[32] = "unknown";
		int fill = total > 0 ? (int)(30 * done / total) : 0;
		for (int k = 0; k < 30; k++)
			bar[k] = k < fill ? '#' : '.';
		bar[30] = '\0';
		if (json_is_number(eta))
			fmt_duration(json_number_value(eta), left, sizeof left);
		printf("  work unit %lld (version %lld): [%s] %lld/%lld microbatches, %.1f samples/s, %s "
		       "left\n",
		       (long long)json_integer_value(json_object_get(w, "id")),
		       (long long)json_integer_value(json_object_get(w, "version")), bar, done, total, sps,
		       left);
	}
}

static void print_prefs(const json_t *a)
{
	const json_t *eff = json_object_get(a, "effective"), *loc = json_object_get(a, "local");
	const char *k;
	const json_t *v;
	json_object_foreach((json_t *)eff, k, v)
	{
		char *s = json_dumps(v, JSON_ENCODE_ANY);
		printf("%-16s %-14s%s\n", k, s ? s : "?", json_object_get(loc, k) ? " (local)" : "");
		free(s);
	}
}

static void print_error(const json_t *a)
{
	const json_t *e = json_object_get(a, "error");
	fprintf(stderr, "cotrainctl: %s\n",
	        json_string_value(json_object_get(e, "message")) ?: "the daemon refused");
	if (json_is_string(json_object_get(e, "hint")))
		fprintf(stderr, "hint: %s\n", json_string_value(json_object_get(e, "hint")));
}

/* ---- the commands: each builds its request from its arguments and prints
 * the daemon's answer ------------------------------------------------------ */

/* A builder takes the command's arguments (argv[0] is the first after the
 * command's name) and adds them to req; it returns 0, or EX_USAGE for bad
 * arguments (the caller prints the command's usage). */
typedef int (*cmd_build)(int argc, char **argv, json_t *req);
typedef void (*cmd_print)(const json_t *a);

static int build_none(int argc, char **argv, json_t *req)
{
	(void)argv, (void)req;
	return argc ? EX_USAGE : EX_OK;
}

static int build_attach(int argc, char **argv, json_t *req)
{
	const char *url = NULL, *key = NULL, *email = NULL;
	int pw_stdin = 0;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
			key = argv[++i];
		else if (strcmp(argv[i], "--email") == 0 && i + 1 < argc)
			email = argv[++i];
		else if (strcmp(argv[i], "--password-stdin") == 0)
			pw_stdin = 1;
		else if (strcmp(argv[i], "--share") == 0 && i + 1 < argc) {
			char *end;
			double sh = strtod(argv[++i], &end);
			if (*end || !(sh > 0))
				return EX_USAGE;
			json_object_set_new(req, "resource_share", json_real(sh));
		} else if (argv[i][0] != '-' && !url)
			url = argv[i];
		else
			return EX_USAGE;
	}
	if (!url || (!key && !(email && pw_stdin)))
		return EX_USAGE;
	json_object_set_new(req, "url", json_string(url));
	if (key)
		json_object_set_new(req, "account_key", json_string(key));
	if (email) {
		char pw[1025];
		if (!fgets(pw, sizeof pw, stdin)) {
			fprintf(stderr, "cotrainctl: no password on standard input\n");
			return EX_USAGE;
		}
		pw[strcspn(pw, "\r\n")] = '\0';
		json_object_set_new(req, "email", json_string(email));
		json_object_set_new(req, "password", json_string(pw));
	}
	return EX_OK;
}

static int build_detach(int argc, char **argv, json_t *req)
{
	if (argc != 1)
		return EX_USAGE;
	json_object_set_new(req, "project", json_string(argv[0]));
	return EX_OK;
}

static int build_prefs(int argc, char **argv, json_t *req)
{
	int i = 0;
	const char *sub = i < argc ? argv[i++] : "get";
	if (strcmp(sub, "get") == 0)
		return i != argc ? EX_USAGE : EX_OK;
	if (strcmp(sub, "set") != 0 && strcmp(sub, "unset") != 0)
		return EX_USAGE;
	json_t *coll = sub[0] == 's' ? json_object() : json_array();
	json_object_set_new(req, sub, coll);
	if (i == argc)
		return EX_USAGE;
	for (; i < argc; i++) {
		if (sub[0] == 's') {
			char *eq = strchr(argv[i], '=');
			if (!eq)
				return EX_USAGE;
			*eq = '\0';
			json_object_set_new(coll, argv[i], json_string(eq + 1));
		} else {
			json_array_append_new(coll, json_string(argv[i]));
		}
	}
	return EX_OK;
}

static int build_log(int argc, char **argv, json_t *req)
{
	if (argc == 0)
		return EX_OK;
	char *end = NULL;
	long n = argc == 2 && strcmp(argv[0], "-n") == 0 ? strtol(argv[1], &end, 10) : 0;
	if (!end || *end || n < 1)
		return EX_USAGE;
	json_object_set_new(req, "lines", json_integer(n));
	return EX_OK;
}

static void print_log(const json_t *a)
{
	size_t k;
	const json_t *l;
	json_array_foreach(json_object_get(a, "lines"), k, l) printf("%s\n", json_string_value(l));
}

static void print_attach(const json_t *a)
{
	printf("attached to %s as host %lld\n", json_string_value(json_object_get(a, "project")),
	       (long long)json_integer_value(json_object_get(a, "host_id")));
}

static void print_detach(const json_t *a)
{
	printf("detached from %s\n", json_string_value(json_object_get(a, "project")));
}

static void print_suspended(const json_t *a)
{
	(void)a;
	printf("suspended\n");
}

static void print_resumed(const json_t *a)
{
	(void)a;
	printf("resumed\n");
}

static const struct {
	const char *name, *args, *help;
	cmd_build build;
	cmd_print print;
} cmds[] = {
	{ "status", "", "projects, current work with progress, samples per second, time left", build_none,
	  print_status },
	{ "attach", "URL (--key KEY | --email EMAIL --password-stdin) [--share N]",
	  "attach to the project at URL (https://server/projects/NAME)", build_attach, print_attach },
	{ "detach", "PROJECT", "detach from a project (by name or URL), handing back its work", build_detach,
	  print_detach },
	{ "suspend", "", "stop computing until resume (survives restarts)", build_none, print_suspended },
	{ "resume", "", "compute again", build_none, print_resumed },
	{ "prefs", "[get | set KEY=VALUE... | unset KEY...]",
	  "show or change local preferences (they override the account's and the config file's)", build_prefs,
	  print_prefs },
	{ "log", "[-n LINES]", "the daemon's recent log lines (default 50)", build_log, print_log },
};
#define NCMDS (int)(sizeof cmds / sizeof cmds[0])

static void list_commands(FILE *f)
{
	fprintf(f, "\nCommands:\n");
	for (int i = 0; i < NCMDS; i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
}

static void cmd_usage(FILE *f, int i)
{
	fprintf(f, "usage: cotrainctl [--json] %s %s\n%s\n", cmds[i].name, cmds[i].args, cmds[i].help);
	if (strcmp(cmds[i].name, "prefs") == 0)
		fprintf(f,
		        "\nKeys: max_threads, cpu_percent, cpu_time_percent, only_when_idle, idle_after "
		        "(s),\n"
		        "only_on_ac, use_gpu, gpu_only_when_idle, gpu_device, "
		        "download_limit, upload_limit (bytes/s), disk_max, memory_max (bytes; k M G T).\n");
}

/* ---- the global options --------------------------------------------------- */

typedef struct {
	const char *socket;
	int json;
} ctl_cli;

static const opt_spec ctl_opts[] = {
	{ "socket", 0, OPT_STRING, offsetof(ctl_cli, socket), .metavar = "PATH",
	  .help = "the daemon's socket (default $COTRAIN_SOCKET, else " DEFAULT_SOCKET ")" },
	{ "json", 0, OPT_FLAG, offsetof(ctl_cli, json), .help = "print the answer as JSON" },
	{ "help", 'h', OPT_HELP, .help = "this help; COMMAND --help for a command's" },
	{ "version", 0, OPT_VERSION, .help = "the version" },
	{ NULL }
};

static const opt_program ctl_prog = {
	.prog = "cotrainctl",
	.synopsis = "[--socket PATH] [--json] COMMAND [ARG]...",
	.intro = "Control the cotrain-client daemon.\n",
	.commands = list_commands,
	.outro = "Exit status: 0 ok, 1 refused by the daemon, 2 bad usage, 3 daemon not running,\n"
	         "4 permission denied (join the daemon's group, e.g. cotrain).\n",
	.opts = ctl_opts,
	.stop_at_command = true,
	.allow_args = true,
};

int main(int argc, char **argv)
{
	ctl_cli cli = { .socket = getenv("COTRAIN_SOCKET") };
	if (!cli.socket || !*cli.socket)
		cli.socket = DEFAULT_SOCKET;
	int i;
	opt_result orc = opt_parse(&ctl_prog, argc, argv, &cli, &i);
	if (orc)
		return orc == OPT_EXIT ? EX_OK : EX_USAGE;
	if (i >= argc) {
		opt_help(&ctl_prog, stderr);
		return EX_USAGE;
	}
	const char *cmd = argv[i++];
	int ci = -1;
	for (int k = 0; k < NCMDS; k++)
		if (strcmp(cmd, cmds[k].name) == 0)
			ci = k;
	if (ci < 0) {
		fprintf(stderr, "cotrainctl: unknown command \"%s\"\n", cmd);
		opt_help(&ctl_prog, stderr);
		return EX_USAGE;
	}
	for (int k = i; k < argc; k++)
		if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
			cmd_usage(stdout, ci);
			return EX_OK;
		}
	json_t *req = json_pack("{s:s}", "cmd", cmd);
	if (!req || cmds[ci].build(argc - i, argv + i, req)) {
		cmd_usage(stderr, ci);
		json_decref(req);
		return EX_USAGE;
	}
	int ex;
	json_t *a = call(cli.socket, req, &ex);
	json_decref(req);
	if (!a)
		return ex;
	if (cli.json) {
		char *s = json_dumps(a, JSON_INDENT(2) | JSON_SORT_KEYS);
		printf("%s\n", s ? s : "{}");
		free(s);
	} else if (ex != EX_OK) {
		print_error(a);
	} else {
		cmds[ci].print(a);
	}
	json_decref(a);
	return ex;
}
