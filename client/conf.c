/* cotrain client: the configuration file (see conf.h). */
#include "client/conf.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client/round.h"
#include "shared/common/log.h"

#define CONFIG_MAX_BYTES (1 << 20)
#define LINE_MAX_BYTES 4096

void cl_config_defaults(cl_config *c)
{
	memset(c, 0, sizeof *c);
	snprintf(c->state_dir, sizeof c->state_dir, "%s", CL_DEFAULT_STATE);
	snprintf(c->socket_group, sizeof c->socket_group, "cotrain");
	c->log_level = COT_LOG_INFO;
	c->heartbeat_interval = 20;
	c->retry_base = 15;
	c->retry_max = 600;
	c->http_timeout = 60;
	c->max_file_bytes = 8LL << 30;
	c->benchmark_seconds = 3;
	c->idle_mode = IDLE_AUTO;
	snprintf(c->idle_tty_glob, sizeof c->idle_tty_glob, "/dev/tty[0-9]* /dev/pts/[0-9]*");
	snprintf(c->power_supply_dir, sizeof c->power_supply_dir, "/sys/class/power_supply");
	snprintf(c->peer_listen, sizeof c->peer_listen, "0.0.0.0");
	c->peer_port = 0;
	c->peer_bandwidth = 12500000;
	c->spot_interval = 300;
	c->port_mapping = 1;
	c->prefs.set = 0;
}

static cot_err set_int(const char *key, const char *v, long long min, long long max, long long *out,
                       cot_errbuf *eb)
{
	char *end;
	errno = 0;
	long long n = strtoll(v, &end, 10);
	if (end == v || *end || errno || n < min || n > max)
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "invalid value \"%.64s\" for \"%s\": expected an integer between %lld and "
		                  "%lld",
		                  v, key, min, max);
	*out = n;
	return COT_OK;
}

static cot_err set_path(const char *key, const char *v, char *dst, size_t len, cot_errbuf *eb)
{
	if (v[0] != '/')
		return cot_seterr(eb, COT_ERR_INVALID, "\"%s\" must be an absolute path, not \"%.64s\"", key,
		                  v);
	if (strlen(v) >= len)
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "value of \"%s\" is too long", key);
	memcpy(dst, v, strlen(v) + 1);
	return COT_OK;
}

cot_err cl_config_set(cl_config *c, const char *key, const char *v, cot_errbuf *eb)
{
	long long n = 0;
	cot_err rc;
	if (strcmp(key, "state_dir") == 0)
		return set_path(key, v, c->state_dir, sizeof c->state_dir, eb);
	if (strcmp(key, "socket") == 0)
		return set_path(key, v, c->socket, sizeof c->socket, eb);
	if (strcmp(key, "power_supply_dir") == 0)
		return set_path(key, v, c->power_supply_dir, sizeof c->power_supply_dir, eb);
	if (strcmp(key, "socket_group") == 0) {
		if (strlen(v) >= sizeof c->socket_group)
			return cot_seterr(eb, COT_ERR_TOO_LARGE, "value of \"%s\" is too long", key);
		snprintf(c->socket_group, sizeof c->socket_group, "%s", v);
		return COT_OK;
	}
	if (strcmp(key, "idle_tty_glob") == 0) {
		if (strlen(v) >= sizeof c->idle_tty_glob)
			return cot_seterr(eb, COT_ERR_TOO_LARGE, "value of \"%s\" is too long", key);
		snprintf(c->idle_tty_glob, sizeof c->idle_tty_glob, "%s", v);
		return COT_OK;
	}
	if (strcmp(key, "peer_listen") == 0 || strcmp(key, "peer_address") == 0) {
		char *dst = key[5] == 'l' ? c->peer_listen : c->peer_address;
		unsigned char buf[16];
		if (strlen(v) >= DIALER_ADDR_MAX ||
		    (inet_pton(AF_INET, v, buf) != 1 && inet_pton(AF_INET6, v, buf) != 1))
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid value \"%.64s\" for \"%s\": expected a numeric IPv4 or "
			                  "IPv6 address",
			                  v, key);
		snprintf(dst, DIALER_ADDR_MAX, "%s", v);
		return COT_OK;
	}
	if (strcmp(key, "nat_service") == 0) {
		if (cl_parse_endpoint(v, c->nat_addr, &c->nat_port, eb))
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid value \"%.64s\" for \"nat_service\": expected "
			                  "ADDRESS:PORT with a numeric address",
			                  v);
		return COT_OK;
	}
	if (strcmp(key, "port_mapping") == 0) {
		if (strcmp(v, "true") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "1") == 0)
			c->port_mapping = 1;
		else if (strcmp(v, "false") == 0 || strcmp(v, "no") == 0 || strcmp(v, "0") == 0)
			c->port_mapping = 0;
		else
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid value \"%.64s\" for \"port_mapping\": expected true or "
			                  "false",
			                  v);
		return COT_OK;
	}
	if (strcmp(key, "peer_bandwidth") == 0) {
		rc = set_int(key, v, 1000, 1LL << 40, &n, eb);
		if (rc)
			return rc;
		c->peer_bandwidth = n;
		return COT_OK;
	}
	if (strcmp(key, "log_level") == 0) {
		int l = cot_log_parse_level(v);
		if (l < 0)
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid value \"%.64s\" for \"log_level\": expected debug, info, "
			                  "warn or error",
			                  v);
		c->log_level = l;
		return COT_OK;
	}
	if (strcmp(key, "idle_detection") == 0) {
		static const char *names[] = { "auto", "logind", "tty", "none" };
		for (int i = 0; i < 4; i++)
			if (strcmp(v, names[i]) == 0) {
				c->idle_mode = (cl_idle_mode)i;
				return COT_OK;
			}
		return cot_seterr(eb, COT_ERR_INVALID,
		                  "invalid value \"%.64s\" for \"idle_detection\": expected auto, logind, "
		                  "tty or none",
		                  v);
	}
	struct {
		const char *name;
		int *dst;
		long long min, max;
	} ints[] = {
		{ "heartbeat_interval", &c->heartbeat_interval, 1, 86400 },
		{ "retry_base", &c->retry_base, 1, 3600 },
		{ "retry_max", &c->retry_max, 1, 86400 },
		{ "http_timeout", &c->http_timeout, 1, 3600 },
		{ "benchmark_seconds", &c->benchmark_seconds, 1, 600 },
		{ "peer_port", &c->peer_port, 0, 65535 },
		{ "spot_interval", &c->spot_interval, 1, 86400 },
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
		if (strcmp(key, ints[i].name) == 0) {
			rc = set_int(key, v, ints[i].min, ints[i].max, &n, eb);
			if (rc)
				return rc;
			*ints[i].dst = (int)n;
			return COT_OK;
		}
	if (strcmp(key, "max_file_bytes") == 0) {
		/* Reuse the byte-count parser of the preferences. */
		cl_prefs tmp = { .set = 0 };
		if (cl_prefs_set_text(&tmp, PREF_DISK_MAX, v, NULL))
			return cot_seterr(eb, COT_ERR_INVALID,
			                  "invalid value \"%.64s\" for \"max_file_bytes\": expected a byte "
			                  "count between 1M and 1P",
			                  v);
		c->max_file_bytes = tmp.v[PREF_DISK_MAX];
		return COT_OK;
	}
	int k = cl_prefs_key(key);
	if (k >= 0)
		return cl_prefs_set_text(&c->prefs, (cl_pref_key)k, v, eb);
	return cot_seterr(eb, COT_ERR_INVALID, "unknown configuration key \"%.64s\"", key);
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

cot_err cl_config_load(cl_config *c, const char *path, cot_errbuf *eb)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno == ENOENT)
			return cot_seterr(eb, COT_ERR_NOT_FOUND, "configuration file \"%s\" does not exist",
			                  path);
		return cot_seterr(eb, COT_ERR_IO, "could not open configuration file \"%s\": %s", path,
		                  strerror(errno));
	}
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && st.st_size > CONFIG_MAX_BYTES) {
		fclose(f);
		return cot_seterr(eb, COT_ERR_TOO_LARGE, "configuration file \"%s\" is larger than 1 MiB",
		                  path);
	}
	char line[LINE_MAX_BYTES];
	int lineno = 0;
	cot_err rc = COT_OK;
	while (fgets(line, sizeof line, f)) {
		lineno++;
		size_t len = strlen(line);
		if (len == sizeof line - 1 && line[len - 1] != '\n' && !feof(f)) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "%s:%d: line is longer than %d bytes", path,
			                lineno, LINE_MAX_BYTES - 1);
			break;
		}
		char *s = trim(line);
		if (*s == '#' || *s == '\0')
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			rc = cot_seterr(eb, COT_ERR_INVALID, "%s:%d: expected \"key = value\"", path, lineno);
			break;
		}
		*eq = '\0';
		char *key = trim(s), *val = trim(eq + 1);
		size_t vl = strlen(val);
		if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
			val[vl - 1] = '\0';
			val++;
		}
		cot_errbuf e2 = { "", "" };
		rc = cl_config_set(c, key, val, &e2);
		if (rc) {
			cot_seterr(eb, rc, "%s:%d: %s", path, lineno, e2.msg);
			break;
		}
	}
	if (!rc && ferror(f))
		rc = cot_seterr(eb, COT_ERR_IO, "could not read configuration file \"%s\": %s", path,
		                strerror(errno));
	fclose(f);
	return rc;
}

cot_err cl_config_finish(cl_config *c, cot_errbuf *eb)
{
	if (c->socket[0] == '\0') {
		int n = snprintf(c->socket, sizeof c->socket, "%s/control.sock", c->state_dir);
		if (n < 0 || (size_t)n >= sizeof c->socket)
			return cot_seterr(eb, COT_ERR_TOO_LARGE, "state directory path is too long");
	}
	if (c->retry_max < c->retry_base)
		c->retry_max = c->retry_base;
	return COT_OK;
}
