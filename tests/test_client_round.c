/* cotrain tests: the client's round plan parsing (hostile answers refused
 * with a reason, nothing half-parsed used), endpoints, and the mean that must
 * match the server's bit for bit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "client/round.h"
#include "tests/tap.h"

#define GOOD \
	"{\"project\":\"p\",\"version\":3,\"attempt\":1,\"state\":\"averaging\",\"host_id\":7," \
	"\"group\":0,\"n_groups\":1,\"round_samples\":30,\"param_count\":100,\"deadline\":\"2026-11-22T00:" \
	"10:00+00:00\"," \
	"\"compression\":\"none\",\"members\":[" \
	"{\"host_id\":5,\"endpoint\":\"127.0.0.1:7000\",\"samples\":10,\"can_aggregate\":true,\"lo\":0," \
	"\"hi\":60}," \
	"{\"host_id\":7,\"endpoint\":\"[::1]:7001\",\"samples\":20,\"can_aggregate\":false,\"lo\":60," \
	"\"hi\":100}]}"

static cot_err parse(const char *text, int64_t host, int64_t version, int64_t params, cl_plan *p,
                     cot_errbuf *eb)
{
	json_t *j = json_loads(text, 0, NULL);
	if (!j)
		return COT_ERR_INVALID;
	cot_err rc = cl_plan_parse(j, host, version, params, p, eb);
	json_decref(j);
	return rc;
}

/* GOOD with one substring replaced. */
static cot_err parse_edit(const char *from, const char *to, cot_errbuf *eb)
{
	static cl_plan p;
	char buf[4096];
	const char *at = strstr(GOOD, from);
	if (!at)
		return COT_ERR_INTERNAL;
	snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - GOOD), GOOD, to, at + strlen(from));
	return parse(buf, 7, 3, 100, &p, eb);
}

int main(void)
{
	plan_lazy();
	static cl_plan p;
	cot_errbuf eb = { "", "" };
	is_int(parse(GOOD, 7, 3, 100, &p, &eb), COT_OK, "a good plan parses (%s)", eb.msg);
	is_int((long long)p.n, 2, "two members");
	is_int((long long)p.self, 1, "we are the second");
	ok(strcmp(p.members[1].addr, "::1") == 0 && p.members[1].port == 7001, "an IPv6 endpoint");
	ok(p.members[0].lo == 0 && p.members[0].hi == 60 && p.members[1].lo == 60, "ranges");
	ok(!p.has_gradient && p.params_sha256[0] == '\0', "no gradient or hash yet");

	struct {
		const char *from, *to, *why;
	} bad[] = {
		{ "\"lo\":60", "\"lo\":61", "ranges with a hole" },
		{ "\"hi\":100", "\"hi\":99", "ranges short of the vector" },
		{ "\"host_id\":5", "\"host_id\":9", "members out of order" },
		{ "\"host_id\":5", "\"host_id\":7", "a member twice" },
		{ "127.0.0.1:7000", "example.org:7000", "a name instead of an address" },
		{ "127.0.0.1:7000", "127.0.0.1:0", "port 0" },
		{ "127.0.0.1:7000", "127.0.0.1:99999", "a port past 65535" },
		{ "127.0.0.1:7000", "127.0.0.1", "no port" },
		{ "[::1]:7001", "[::1:7001", "an unclosed IPv6 bracket" },
		{ "\"samples\":10", "\"samples\":0", "a member without samples" },
		{ "\"round_samples\":30", "\"round_samples\":31", "samples that do not add up in one group" },
		{ "\"compression\":\"none\"", "\"compression\":\"zip\"", "an unknown compression" },
		{ "\"param_count\":100", "\"param_count\":101", "another model's size" },
		{ "\"version\":3", "\"version\":4", "another round" },
		{ "\"host_id\":7,\"group\"", "\"host_id\":8,\"group\"", "another host's plan" },
		{ "\"group\":0", "\"group\":1", "a group past n_groups" },
		{ "\"deadline\":\"2026-11-22T00:10:00+00:00\"", "\"deadline\":\"soon\"",
		  "a deadline that is no time" },
		{ "\"members\":[", "\"members\":\"x\",\"other\":[", "members that are no array" },
		{ "\"host_id\":7,\"endpoint\"", "\"host_id\":6,\"endpoint\"", "a plan we are not in" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		eb.msg[0] = '\0';
		cot_err rc = parse_edit(bad[i].from, bad[i].to, &eb);
		ok(rc == COT_ERR_NETWORK && strstr(eb.msg, "invalid averaging plan"), "refused: %s (%s)",
		   bad[i].why, eb.msg);
	}

	/* Several groups: the server's mean and hash show up once known. */
	char multi[4096];
	snprintf(multi, sizeof multi,
	         "%.*s,\"gradient\":{\"sha256\":\"%064d\",\"url\":\"/files/x\",\"samples\":50},"
	         "\"params_sha256\":\"%064d\"}",
	         (int)strlen(GOOD) - 1, GOOD, 0, 1);
	char *n1 = strstr(multi, "\"n_groups\":1");
	n1[11] = '2';
	char *rs = strstr(multi, "\"round_samples\":30");
	memcpy(rs, "\"round_samples\":50", 18);
	is_int(parse(multi, 7, 3, 100, &p, &eb), COT_OK, "a plan of two groups with the mean known (%s)",
	       eb.msg);
	ok(p.has_gradient && p.gradient_samples == 50 && p.n_groups == 2, "the gradient's samples");

	/* Across groups between the peers: our range [60, 100) in two slices,
	 * each shared with host 9 of the other group. */
	char cross[8192], edited[8192];
	snprintf(cross, sizeof cross,
	         "%.*s,\"cross_group\":\"peers\",\"cross\":["
	         "{\"index\":1,\"lo\":60,\"hi\":80,\"holders\":["
	         "{\"host_id\":7,\"endpoint\":\"[::1]:7001\",\"group\":0,\"lo\":60,\"hi\":70},"
	         "{\"host_id\":9,\"endpoint\":\"127.0.0.1:7009\",\"group\":1,\"lo\":70,\"hi\":80}]},"
	         "{\"index\":2,\"lo\":80,\"hi\":100,\"holders\":["
	         "{\"host_id\":7,\"endpoint\":\"[::1]:7001\",\"group\":0,\"lo\":80,\"hi\":80},"
	         "{\"host_id\":9,\"endpoint\":\"127.0.0.1:7009\",\"group\":1,\"lo\":80,\"hi\":100}]}]}",
	         (int)strlen(multi) - 1, multi);
	eb.msg[0] = '\0';
	is_int(parse(cross, 7, 3, 100, &p, &eb), COT_OK, "a plan across groups between the peers (%s)",
	       eb.msg);
	ok(p.cross_peers && p.n_cross == 2 && p.cross[0].index == 1 && p.cross[0].n == 2 &&
	           p.cross[0].self == 0 && p.cross[1].lo == 80 && p.cross[1].hi == 100 &&
	           p.cross[1].holders[1].host_id == 9 && p.cross[1].holders[1].port == 7009,
	   "its slices and their holders");
	cl_plan_free(&p);
	struct {
		const char *from, *to, *why;
	} xbad[] = {
		{ "\"lo\":80,\"hi\":100,\"holders\"", "\"lo\":81,\"hi\":100,\"holders\"",
		  "slices with a hole" },
		{ "\"host_id\":9,\"endpoint\":\"127.0.0.1:7009\",\"group\":1,\"lo\":70",
		  "\"host_id\":9,\"endpoint\":\"127.0.0.1:7009\",\"group\":1,\"lo\":71",
		  "holders that do not tile a slice" },
		{ "{\"host_id\":7,\"endpoint\":\"[::1]:7001\",\"group\":0,\"lo\":60",
		  "{\"host_id\":8,\"endpoint\":\"[::1]:7001\",\"group\":0,\"lo\":60",
		  "a slice we do not hold" },
		{ "\"cross_group\":\"peers\"", "\"cross_group\":\"sideways\"", "an unknown cross_group" },
		{ "\"cross_group\":\"peers\"", "\"cross_group\":\"server\"", "slices through the server" },
		{ "\"endpoint\":\"127.0.0.1:7009\"", "\"endpoint\":\"h.example:7009\"", "a holder's name" },
	};
	for (size_t i = 0; i < sizeof xbad / sizeof xbad[0]; i++) {
		const char *at = strstr(cross, xbad[i].from);
		snprintf(edited, sizeof edited, "%.*s%s%s", (int)(at - cross), cross, xbad[i].to,
		         at + strlen(xbad[i].from));
		eb.msg[0] = '\0';
		cot_err rc = parse(edited, 7, 3, 100, &p, &eb);
		ok(rc == COT_ERR_NETWORK && strstr(eb.msg, "invalid averaging plan") && !p.cross,
		   "refused: %s (%s)", xbad[i].why, eb.msg);
	}
	/* An aggregator's plan across groups must carry its slices. */
	snprintf(edited, sizeof edited, "%.*s,\"cross_group\":\"peers\"}", (int)strlen(multi) - 1, multi);
	ok(parse(edited, 7, 3, 100, &p, &eb) == COT_ERR_NETWORK && strstr(eb.msg, "has no \"cross\""),
	   "refused: an aggregator across groups without its slices (%s)", eb.msg);

	/* The mean: one division in double, one rounding, as the server. */
	float sum[3] = { 1.0f, 3.0f, 1e-30f }, mean[3];
	cl_round_mean(sum, 3, 3, mean);
	ok(mean[0] == (float)(1.0 / 3.0) && mean[1] == 1.0f && mean[2] == (float)(1e-30f / 3.0),
	   "mean = (float)((double)sum / total)");
	cl_round_mean(sum, 3, 3, sum);
	ok(memcmp(sum, mean, sizeof mean) == 0, "the mean may be taken in place");
	done_testing();
	return exit_status();
}
