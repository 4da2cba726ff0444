/* cotrain client: the host's hardware (see hostinfo.h). */
#include "client/hostinfo.h"

#include <stdio.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "config.h"
#include "shared/common/hash.h"

void cl_hostinfo_read(cl_hostinfo *h)
{
	memset(h, 0, sizeof *h);
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	while (f && fgets(line, sizeof line, f)) {
		if (strncmp(line, "model name", 10) == 0) {
			char *c = strchr(line, ':');
			if (c) {
				c++;
				while (*c == ' ' || *c == '\t')
					c++;
				c[strcspn(c, "\n")] = '\0';
				snprintf(h->cpu_model, sizeof h->cpu_model, "%s", c);
			}
			break;
		}
	}
	if (f)
		fclose(f);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	h->cores = n > 0 ? (n > 4096 ? 4096 : (int)n) : 1;
	struct sysinfo si;
	if (sysinfo(&si) == 0)
		h->memory_bytes = (int64_t)si.totalram * si.mem_unit;
	struct utsname u;
	if (uname(&u) == 0) {
		snprintf(h->os_name, sizeof h->os_name, "%s", u.sysname);
		snprintf(h->os_version, sizeof h->os_version, "%s", u.release);
	}
	snprintf(h->client_version, sizeof h->client_version, "cotrain-client %s", PACKAGE_VERSION);
}

void cl_hostinfo_fingerprint(const cl_hostinfo *h, char out[65])
{
	char buf[512];
	int n = snprintf(buf, sizeof buf, "%s|%d|%lld|%s", h->cpu_model, h->cores,
	                 (long long)(h->memory_bytes >> 28), h->gpu);
	hash_sha256_hex(buf, (size_t)n, out);
}

void cl_hostinfo_machine_id(const char *secret, const char *base, const char *name, char out[65])
{
	out[0] = '\0';
	if (!secret[0])
		return;
	char buf[64 + 1024 + 64 + 3];
	int n = snprintf(buf, sizeof buf, "%s|%s|%s", secret, base, name);
	if (n < 0 || (size_t)n >= sizeof buf || hash_sha256_hex(buf, (size_t)n, out))
		out[0] = '\0';
}
