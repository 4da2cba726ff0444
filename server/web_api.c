/* cotrain-server: the JSON behind the project page and the training
 * dashboard, and the network part of a host's page (public). */
#include "server/credit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/apiutil.h"

/* Rounds newest first (up to $2), each with its loss when the round table
 * has one (to_jsonb keeps this statement valid whether or not it does) and
 * the held-out bits per byte of its version (the model it trained), null
 * until evaluated. */
static const dbc_stmt st_dash = {
	"web_dashboard",
	"SELECT json_build_object('project', p.name, 'title', p.title,"
	"       'description', p.description, 'dataset', d.name, 'n_tokens', d.n_tokens,"
	"       'tokenizer', d.tokenizer, 'model', p.config->'model',"
	"       'seq_len', p.seq_len, 'target_batch', p.target_batch,"
	"       'flops_per_sample', p.flops_per_sample, 'current_version', p.current_version,"
	"       'active', p.active,"
	"       'active_hosts', (SELECT hosts FROM project_speed(p.id)),"
	"       'samples_per_sec', (SELECT samples_per_sec FROM project_speed(p.id)),"
	"       'total_credit', (SELECT coalesce(sum(g.credit), 0) FROM credit_grant g"
	"                         WHERE g.project_id = p.id AND g.status = 'granted'),"
	/* The contributors (sahajBERT's dashboard): the 100 accounts with the
	 * most samples in the project's rounds (grants not denied), their
	 * granted credit, and when the server last heard of them. */
	"       'contributors', (SELECT coalesce(json_agg(json_build_object('id', c.account_id,"
	"                  'name', c.name, 'samples', c.samples, 'credit', c.credit,"
	"                  'last_seen', c.last_seen) ORDER BY c.samples DESC, c.account_id), '[]')"
	"                    FROM (SELECT g.account_id, a.name,"
	"                                 coalesce(sum(g.samples) FILTER (WHERE g.kind = 'round'), 0) AS "
	"samples,"
	"                                 coalesce(sum(g.credit) FILTER (WHERE g.status = 'granted'), 0) AS "
	"credit,"
	"                                 greatest(max(g.created_at), (SELECT max(h.last_seen) FROM host h"
	"                                                         WHERE h.account_id = g.account_id)) AS "
	"last_seen"
	"                            FROM credit_grant g JOIN account a ON a.id = g.account_id"
	"                           WHERE g.project_id = p.id AND g.status <> 'denied' AND NOT a.disabled"
	"                           GROUP BY g.account_id, a.name"
	"                           ORDER BY 3 DESC, g.account_id LIMIT 100) c),"
	"       'rounds', (SELECT coalesce(json_agg(json_build_object('version', r.version,"
	"                  'attempt', r.attempt, 'state', r.state, 'samples', r.samples,"
	"                  'loss', to_jsonb(r)->'loss', 'n_groups', r.n_groups,"
	"                  'heldout_bpb', (SELECT mv.heldout_bpb FROM model_version mv"
	"                                   WHERE mv.project_id = r.project_id AND mv.version = r.version),"
	"                  'heldout_mlm_loss', (SELECT mv.heldout_mlm_loss FROM model_version mv"
	"                                   WHERE mv.project_id = r.project_id AND mv.version = r.version),"
	"                  'heldout_mlm_accuracy', (SELECT mv.heldout_mlm_accuracy FROM model_version mv"
	"                                   WHERE mv.project_id = r.project_id AND mv.version = r.version),"
	"                  'n_peers', (SELECT count(*) FROM round_member m"
	"                               WHERE m.project_id = r.project_id AND m.version = r.version),"
	"                  'opened_at', r.opened_at, 'closed_at', r.closed_at,"
	"                  'committed_at', r.committed_at,"
	"                  'seconds', extract(epoch FROM r.committed_at - r.opened_at))"
	"                  ORDER BY r.version DESC), '[]')"
	"                    FROM (SELECT * FROM round r WHERE r.project_id = p.id"
	"                           ORDER BY r.version DESC LIMIT $2) r))::text"
	"  FROM project p JOIN dataset d ON d.id = p.dataset_id"
	" WHERE p.name = $1",
	2
};

void web_dashboard(http_req *req)
{
	if (strlen(req->params[0]) > 64) {
		http_reply_error(req, 404, "not_found", "project does not exist", NULL);
		return;
	}
	long long n = 200;
	const char *s = http_query(req, "rounds");
	if (s) {
		char *end;
		errno = 0;
		n = strtoll(s, &end, 10);
		if (errno || end == s || *end || n < 1 || n > 1000) {
			http_reply_error(req, 400, "invalid", "rounds must be an integer from 1 to 1000",
			                 NULL);
			return;
		}
	}
	char ns[24];
	snprintf(ns, sizeof ns, "%lld", n);
	const char *params[] = { req->params[0], ns };
	char msg[120];
	snprintf(msg, sizeof msg, "project \"%.80s\" does not exist", req->params[0]);
	api_reply_row(req, &st_dash, params, msg);
}

/* The public part of a host's reachability (no public endpoint: that is the
 * volunteer's address, shown to its owner only by GET /v1/hosts/{id}) and
 * its links (db/functions/nat.sql). */
static const dbc_stmt st_host_network = { "web_host_network",
	                                  "SELECT json_build_object('host_id', h.id,"
	                                  "       'reachability', host_reachability_json(h, false),"
	                                  "       'links', host_links_json(h.id))::text"
	                                  "  FROM host h JOIN account a ON a.id = h.account_id"
	                                  " WHERE h.id = $1 AND NOT a.disabled",
	                                  1 };

void web_host_network(http_req *req)
{
	long long id;
	if (!api_path_id(req, 0, "host", &id))
		return;
	char ids[24];
	snprintf(ids, sizeof ids, "%lld", id);
	const char *params[] = { ids };
	char msg[80];
	snprintf(msg, sizeof msg, "host %lld does not exist", id);
	api_reply_row(req, &st_host_network, params, msg);
}
