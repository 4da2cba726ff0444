#!/usr/bin/env python3
"""cotrain tests: a hostile-input campaign against a running cotrain-server.

Every route of the API (doc/api.md), the web pages and the NAT service's
line protocol, sent what a hostile volunteer could send: each body field
replaced in turn by values of every JSON type and size, fields dropped,
bodies that are not JSON objects, path ids and query values out of every
range, bad credentials, hostile Range headers, and raw bytes that are not
HTTP.  The round is driven far enough (a work unit finished and reported,
the round planned) that the round's own routes are reached in the state
that reads their bodies.

Each answer must be a status below 500, and every refusal of the API the
error object doc/api.md promises, its message in PostgreSQL's style.  A
batch of requests that were all refused must leave the database as it
was (`--fingerprint-cmd` prints a digest of its tables).  The server must
answer after each batch.  Prints TAP; exits 1 when any check failed.

  hostile_requests.py --port P --project NAME --account-key KEY
                      --fingerprint-cmd CMD [--relay-port R] [--seed N]
"""
import argparse
import hashlib
import http.client
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

# Values that take each field out of its type, range or size.
HOSTILE_VALUES = [
    None, True, False, 0, -1, 1, 7, 2**31 - 1, 2**31, -2**31 - 1, 2**53 + 1,
    2**63 - 1, 2**63, -2**63 - 1, 2**64, 10**40, 1.5, -0.0, 1e-320, 1e308,
    -1e308, "", "x", "1", "-1", "1e400", "NaN", "ok", "A" * 300, "A" * 70000,
    "\u0000", "a\u0000b", "\ufffe", "\ud800", "\u202e" * 3, "é" * 200,
    [], [1], [None], ["x"] * 5, [[[[[]]]]], {}, {"a": 1}, {"1": "x"},
]
# JSON that Python's encoder cannot write, spliced in where a field's value
# goes (the field is first set to RAW_MARK's string, which is then replaced).
RAW_VALUES = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999",
              b"123456789012345678901234567890", b"1E+2", b"-0", b"0.0000001e-400",
              b"\"\\ud800\\udc00\"", b"\"\\uZZZZ\"", b"\"\xff\xfe\"", b"\"\xc0\xaf\"",
              b"[" * 300 + b"]" * 300]
RAW_MARK = b"\"@@RAW@@\""
# Bodies that are not one JSON object.
BAD_BODIES = [b"", b"{", b"}", b"[]", b"null", b"1", b"\"x\"", b"{\"a\":", b"{\"a\" 1}",
              b"{\"a\":1,\"a\":2}", b"{\"a\":1}{\"b\":2}", b"\xff\xfe\x00", b"{\"\xff\":1}",
              b"[" * 100000, b"{\"a\":" * 50000, b"\x00" * 64, b"{}" + b" " * 70000]
# The server's --body-limit (its default, which the test keeps).
BODY_LIMIT = 64 * 1024
# Path ids, names and query values.
HOSTILE_IDS = ["0", "-1", "1.5", "abc", "1e3", "0x10", "01", "+1", "%201", "1%00", "%00",
               "9223372036854775807", "9223372036854775808", "-9223372036854775809",
               "99999999999999999999999", "..", "%2e%2e", "%2F", "A" * 5000, "'", "1'--",
               "%ff%fe", "1;2", "%25"]
HOSTILE_QUERY = ["", "-1", "0", "61", "1e9", "abc", "99999999999999999999", "%00", "1%00",
                 "1,2", ",", "1,,2", "7,7", "-1,7", "A" * 3000, "%ff", "1.5", "+1"]


class Campaign:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.n = 0
        self.failed = 0
        self.sent = 0
        self.problems = []     # this batch's offending requests
        self.changed_ok = False  # a request of this batch was accepted

    # --- TAP (lines the shell's echo prints again: no backslashes) ----------
    def ok(self, cond, desc):
        desc = desc.replace("\\", "/")
        self.n += 1
        if cond:
            print("ok %d - %s" % (self.n, desc))
        else:
            self.failed += 1
            print("not ok %d - %s" % (self.n, desc))
        sys.stdout.flush()
        return cond

    def diag(self, text):
        for line in text.replace("\\", "/").splitlines():
            print("# " + line)

    # --- HTTP --------------------------------------------------------------
    def request(self, method, path, body=None, auth=None, headers=None, ctype="application/json"):
        """One request on a fresh connection: (status, headers dict, body
        bytes); status 0 when the server closed the connection without an
        answer, -1 when it could not be reached or timed out."""
        h = {}
        if body is not None:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode("utf-8", "surrogatepass")
            if ctype:
                h["Content-Type"] = ctype
        if auth:
            h["Authorization"] = "Bearer " + auth
        h.update(headers or {})
        self.sent += 1
        conn = http.client.HTTPConnection("127.0.0.1", self.args.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            return 0, {}, b""
        except (OSError, http.client.HTTPException):
            return -1, {}, b""
        finally:
            conn.close()

    def judge(self, what, method, path, status, hdrs, data, api=True, body_len=0):
        """Record a problem with one answer: a 5xx, no answer, or an API
        refusal without doc/api.md's error object."""
        why = None
        if status < 0:
            why = "no answer (server down or hung)"
        elif status >= 500:
            why = "status %d" % status
        elif status == 0 and body_len <= BODY_LIMIT:
            # An answerless close is how a server refuses bytes that are not
            # HTTP; for a well-formed request it is a crash or a bug.  (A
            # body over the limit may be answered 413 and closed while it is
            # still being sent: the reset can overtake the answer.)
            why = "connection closed without an answer"
        elif 200 <= status < 300:
            self.changed_ok = True
        elif api and status >= 400 and method != "HEAD":
            why = error_shape_problem(status, data)
        if why:
            self.problems.append("%s %s (%s): %s; body %s" % (method, path[:120], what[:80], why,
                                                               data[:200]))

    def send(self, what, method, path, body=None, auth=None, headers=None, ctype="application/json",
             api=True):
        st, hd, data = self.request(method, path, body, auth, headers, ctype)
        n = len(body) if isinstance(body, (bytes, str)) else len(json.dumps(body)) if body is not None else 0
        self.judge(what, method, path, st, hd, data, api, n)
        return st, hd, data

    # --- batches -----------------------------------------------------------
    def fingerprint(self):
        out = subprocess.run(self.args.fingerprint_cmd, shell=True, capture_output=True)
        return out.stdout

    def batch(self, name, fn):
        """Runs fn (which sends requests); one TAP check for its answers, one
        that the server still answers, and, when every request was refused,
        one that the database did not change."""
        self.problems = []
        self.changed_ok = False
        before = self.fingerprint()
        n0, t0 = self.sent, time.monotonic()
        fn()
        count = self.sent - n0
        self.diag("%s: %d requests in %.1f s" % (name, count, time.monotonic() - t0))
        if not self.ok(not self.problems, "%s: %d requests, each answered below 500 with the "
                       "API's error object" % (name, count)):
            for p in self.problems[:8]:
                self.diag(p)
            if len(self.problems) > 8:
                self.diag("... and %d more" % (len(self.problems) - 8))
        st, _, _ = self.request("GET", "/v1/projects")
        self.ok(st == 200, "%s: the server answers after it (GET /v1/projects: %d)" % (name, st))
        if not self.changed_ok:
            after = self.fingerprint()
            if not self.ok(after == before, "%s: every request refused, the database unchanged" % name):
                changed = set(after.splitlines()) - set(before.splitlines())
                self.diag("changed: " + ", ".join(sorted(t.split(b":")[0].decode() for t in changed)))

    # --- mutation helpers ----------------------------------------------------
    def body_mutations(self, what, method, path, good, auth, extra_values=(), skip=None, raw_json=True):
        """good with each field, at any depth (an object's members, a list's
        first element), replaced by each hostile value (those skip says yes
        to left out) and by every RAW value (unless raw_json is false), each
        object member dropped, and the bad bodies."""
        for at in field_paths(good):
            name = ".".join(str(p) for p in at)
            for v in list(HOSTILE_VALUES) + list(extra_values):
                if not (skip and skip(v)):
                    self.send("%s=%r" % (name, v)[:80], method, path, replaced(good, at, v), auth)
            if isinstance(at[-1], str):
                self.send("without %s" % name, method, path, replaced(good, at, DROP), auth)
            for raw in RAW_VALUES if raw_json else ():
                text = json.dumps(replaced(good, at, "@@RAW@@")).encode().replace(RAW_MARK, raw)
                self.send("%s=%r" % (name, raw[:20]), method, path, text, auth)
        for bad in BAD_BODIES:
            self.send("body %r" % bad[:20], method, path, bad, auth)

    def auth_mutations(self, method, path, body, kinds):
        for a in ["", "x", "A" * 43, "A" * 10000, "\u00e9" * 43, kinds.get("other", "")]:
            self.send("auth %r" % a[:12], method, path, body, a or None)
        for raw in ["Basic Zm9vOmJhcg==", "Bearer", "Bearer  " + kinds.get("own", ""),
                    "bearer " + kinds.get("own", ""), "Bearer " + kinds.get("own", "") + "x"]:
            self.send("auth header %r" % raw[:16], method, path, body, None,
                      headers={"Authorization": raw})


DROP = object()


def field_paths(doc, at=()):
    """The paths of doc's object members and of its lists' first elements,
    outermost first: ("a",), ("a", 0), ("a", 0, "b"), ..."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield at + (k,)
            yield from field_paths(v, at + (k,))
    elif isinstance(doc, list) and doc:
        yield at + (0,)
        yield from field_paths(doc[0], at + (0,))


def replaced(doc, at, value):
    """A deep copy of doc with the element at path at set to value (a
    member dropped for DROP)."""
    doc = json.loads(json.dumps(doc))
    parent = doc
    for p in at[:-1]:
        parent = parent[p]
    if value is DROP:
        del parent[at[-1]]
    else:
        parent[at[-1]] = value
    return doc


def error_shape_problem(status, data):
    """None when data is doc/api.md's error object for status, else why not."""
    try:
        doc = json.loads(data)
    except ValueError:
        return "a refusal that is not JSON"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str) or \
            not isinstance(err.get("message"), str):
        return "a refusal without {\"error\": {\"code\", \"message\"}}"
    msg = err["message"]
    if not msg:
        return "an empty error message"
    if msg[0].isupper() and not msg[:2].isupper():
        return "a message that starts with a capital (PostgreSQL style: lowercase)"
    if msg.endswith("."):
        return "a message that ends with a period"
    codes = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
             405: "method_not_allowed", 413: "too_large", 416: "range_not_satisfiable"}
    if status in codes and err["code"] != codes[status]:
        return "status %d with code %r" % (status, err["code"])
    if status == 409 and err["code"] not in ("already_exists", "conflict"):
        return "status 409 with code %r" % err["code"]
    return None


def must(c, st, data, want, what):
    if st not in want:
        c.diag("setup failed: %s answered %d: %s" % (what, st, data[:300]))
        print("Bail out! setup: %s" % what)
        sys.exit(1)
    return json.loads(data) if data else {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--relay-port", type=int, default=0)
    ap.add_argument("--project", required=True)
    ap.add_argument("--account-key", required=True)
    ap.add_argument("--fingerprint-cmd", required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    c = Campaign(args)
    P, KEY = args.project, args.account_key

    # --- set-up: a team, two hosts, a work unit -------------------------------
    st, _, d = c.request("POST", "/v1/teams", {"name": "hostile-team"}, KEY)
    team = must(c, st, d, (201,), "POST /v1/teams")["team_id"]
    st, _, d = c.request("POST", "/v1/hosts", {"flops": 1e9, "cores": 2}, KEY)
    h = must(c, st, d, (201,), "POST /v1/hosts")
    hid, tok = h["host_id"], h["host_token"]
    st, _, d = c.request("POST", "/v1/hosts", {"flops": 1e9}, KEY)
    h2 = must(c, st, d, (201,), "POST /v1/hosts (a second)")
    hid2, tok2 = h2["host_id"], h2["host_token"]
    st, _, d = c.request("POST", "/v1/projects/%s/work" % P, {"host_id": hid}, tok)
    wu = must(c, st, d, (200,), "POST /v1/projects/%s/work" % P)
    wid, n_mb = wu["work_unit_id"], wu["hi"] - wu["lo"]
    files = [f["sha256"] for f in wu["files"]]
    kinds_acct = {"own": KEY, "other": tok}
    kinds_host = {"own": tok, "other": KEY}

    # --- accounts and teams -----------------------------------------------------
    def accounts():
        c.body_mutations("account", "POST", "/v1/accounts",
                         {"email": "x%d@example.org" % c.rng.randrange(10**9), "name": "n",
                          "password": "a long password"}, None)
        c.body_mutations("login", "POST", "/v1/accounts/login",
                         {"email": "nobody@example.org", "password": "wrong password"}, None)
    c.batch("POST /v1/accounts and /v1/accounts/login", accounts)

    def account():
        c.body_mutations("patch", "PATCH", "/v1/account",
                         {"name": "n", "cross_project_id": "0" * 32, "show_hosts": True}, KEY,
                         ["0" * 31, "G" * 32, "0" * 33])
        for m, p in [("GET", "/v1/account"), ("PATCH", "/v1/account"), ("POST", "/v1/teams")]:
            c.auth_mutations(m, p, {} if m != "GET" else None, kinds_acct)
    c.batch("PATCH /v1/account", account)

    def teams():
        c.body_mutations("team", "POST", "/v1/teams", {"name": "t", "description": "d"}, KEY)
        for i in HOSTILE_IDS:
            c.send("team id", "GET", "/v1/teams/" + i)
            c.send("team id", "POST", "/v1/teams/%s/join" % i, None, KEY)
            c.send("team id", "POST", "/v1/teams/%s/leave" % i, None, KEY)
        c.send("join with a body", "POST", "/v1/teams/%d/join" % team, b"\xff" * 100, KEY)
    c.batch("teams", teams)

    # --- hosts ------------------------------------------------------------------
    def hosts():
        c.body_mutations("host", "POST", "/v1/hosts",
                         {"flops": 1e9, "cpu_model": "c", "cores": 2, "memory_bytes": 1 << 30,
                          "gpu": "g", "client_version": "v", "os_name": "o", "os_version": "1",
                          "machine_id": "f" * 64}, KEY, ["F" * 64, "f" * 63])
        for i in HOSTILE_IDS + [str(hid2 + 1000)]:
            for sub in ("", "/nat", "/network", "/spotchecks"):
                c.send("host id", "GET", "/v1/hosts/%s%s" % (i, sub), None,
                       tok if sub == "/spotchecks" else KEY)
            c.send("host id", "DELETE", "/v1/hosts/" + i, None, KEY)
            c.send("host id", "POST", "/v1/hosts/%s/certificate" % i,
                   {"public_key": "x", "project": P}, tok)
        c.auth_mutations("GET", "/v1/hosts/%d" % hid, None, kinds_acct)
        c.auth_mutations("GET", "/v1/hosts/%d/spotchecks" % hid, None, kinds_host)
        c.send("another account's host", "GET", "/v1/hosts/%d/nat" % hid, None, tok)
    c.batch("hosts", hosts)

    def certificate():
        pem = ("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA" + "A" * 43 + "=\n-----END PUBLIC KEY-----\n")
        c.body_mutations("certificate", "POST", "/v1/hosts/%d/certificate" % hid,
                         {"public_key": "not a key", "project": P}, tok,
                         [pem, pem.replace("PUBLIC", "PRIVATE"), "-----BEGIN PUBLIC KEY-----\n" +
                          "QUFB" * 4000 + "\n-----END PUBLIC KEY-----\n"])
        c.send("another host's id", "POST", "/v1/hosts/%d/certificate" % hid2,
               {"public_key": pem, "project": P}, tok)
    c.batch("POST /v1/hosts/{id}/certificate", certificate)

    # --- projects, files, credit, pages -------------------------------------------
    def public():
        for name in HOSTILE_IDS + [P + "'", P.upper(), "%s%%00" % P]:
            for sub in ("", "/ca", "/dashboard", "/rounds", "/rounds/0/plan?host_id=%d" % hid):
                c.send("project name", "GET", "/v1/projects/%s%s" % (name, sub), None, tok)
            c.send("project name", "GET", "/api/v1/projects/" + name)
        for q in HOSTILE_QUERY:
            c.send("limit", "GET", "/v1/projects/%s/rounds?limit=%s" % (P, q))
            c.send("before", "GET", "/v1/projects/%s/rounds?before=%s" % (P, q))
            c.send("rounds", "GET", "/v1/projects/%s/dashboard?rounds=%s" % (P, q))
            for kind in ("users", "teams", "hosts"):
                c.send("credit", "GET", "/v1/credit/%s?order=%s" % (kind, q))
                c.send("credit", "GET", "/v1/credit/%s?limit=%s" % (kind, q))
                c.send("credit", "GET", "/v1/credit/%s?after=%s" % (kind, q))
        for cur in ["1,2", "1,2,3,4", "x,1,1", "1e400,1,1", "NaN,1,1", "-1,-1,-1",
                    "1,99999999999999999999,1", "1,1,-5", "%2C%2C"]:
            for kind in ("users", "teams", "hosts"):
                c.send("cursor", "GET", "/v1/credit/%s?order=rac&after=%s" % (kind, cur))
        for i in HOSTILE_IDS:
            for kind in ("users", "teams", "hosts", "x"):
                c.send("credit id", "GET", "/v1/credit/%s/%s" % (kind, i))
            c.send("file name", "GET", "/files/" + i, api=True)
            c.send("file name", "HEAD", "/files/" + i)
            c.send("stats", "GET", "/stats/" + i, api=False)
            c.send("static", "GET", "/static/" + i, api=False)
        for f in files[:1]:
            for rng in ["bytes=", "bytes=-0", "bytes=5-3", "bytes=0-0", "bytes=99999999999999999999-",
                        "bytes=-99999999999999999999", "bytes=0-0,1-1", "chars=0-1", "bytes=a-b",
                        "bytes=--1", "bytes=1-2-3", "bytes=" + "9" * 400 + "-", "bytes=0-" + "9" * 40]:
                c.send("range %s" % rng[:20], "GET", "/files/" + f, headers={"Range": rng})
            for inm in ["*", "\"" + f + "\"", "W/\"x\"", "\"" * 1000, ""]:
                c.send("if-none-match", "GET", "/files/" + f, headers={"If-None-Match": inm})
        for page in ("/", "/dashboard", "/leaderboard", "/user", "/team", "/host", "/signup",
                     "/metrics", "/nothing", "/v1", "/v1/", "//", "/v1/projects/" + "/" * 200):
            c.send("page", "GET", page + "?project=%ff&id=-1&x=" + "A" * 2000, api=False)
        for m in ("PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "FOO"):
            c.send("method", m, "/v1/projects", b"{}")
        for form in [b"", b"csrf=x", b"csrf=%ff&email=%00", b"a=" + b"b" * 70000, b"&&&==&",
                     b"csrf=" + b"%" * 100]:
            c.send("sign-up form", "POST", "/signup", form, ctype="application/x-www-form-urlencoded",
                   api=False)
    c.batch("projects, files, credit and pages", public)

    # --- the sign-up form, with its token and cookie: each field hostile ----------------
    def signup():
        st, hd, page = c.send("the form", "GET", "/signup?project=" + P, api=False)
        m = re.search(rb'name="csrf" value="([^"]+)"', page)
        if not c.ok(st == 200 and m is not None, "GET /signup answers the form with its token (%d)" % st):
            return
        token = m.group(1).decode()
        good = {"csrf": token, "project": P, "email": "form@example.org", "name": "form",
                "password": "a long password"}
        values = ["", "x", "A" * 300, "A" * 5000, "<script>alert(1)</script>", "\"'><", "%", "%zz",
                  "é" * 100, "\ufffe", "\u0001", "a\nb", " ", "+", "&", "="]
        passed, tried = 0, 0
        for key in good:
            for v in values:
                form = dict(good, **{key: v})
                st, _, _ = c.send("form %s=%r" % (key, v[:12]), "POST", "/signup", urllib.parse.urlencode(form),
                                  ctype="application/x-www-form-urlencoded",
                                  headers={"Cookie": "cotrain_csrf=" + token}, api=False)
                if key != "csrf":
                    tried += 1
                    passed += st != 403
        # (the forms reach the account rules, where the API's earlier
        # accounts have used up this address's --auth-per-minute: 429)
        c.ok(passed == tried, "  the token and cookie were taken: %d of %d forms with the token got past "
             "the cross-site check" % (passed, tried))
        raw = urllib.parse.urlencode(good)
        for form in [raw + "&email=x@example.org", raw.replace("email=", "email=%ff%fe"),
                     raw.replace("name=", "name=%00"), raw.replace("name=", "name=%C0%AF"),
                     raw + "&" + "x=y&" * 5000, raw + "&=&&=%", "csrf=" + token]:
            c.send("form %r" % form[-20:], "POST", "/signup", form, ctype="application/x-www-form-urlencoded",
                   headers={"Cookie": "cotrain_csrf=" + token}, api=False)
    c.batch("the sign-up form with its token", signup)

    # --- the scheduler --------------------------------------------------------------
    def scheduler():
        c.body_mutations("work", "POST", "/v1/projects/%s/work" % P, {"host_id": hid2}, tok,
                         [hid, hid2 + 1000])
        for q in HOSTILE_QUERY:
            c.send("wait", "POST", "/v1/projects/%s/work?wait=%s" % (P, q), {"host_id": hid2}, tok)
        c.auth_mutations("POST", "/v1/projects/%s/work" % P, {"host_id": hid}, kinds_host)
        for i in HOSTILE_IDS:
            for verb in ("heartbeat", "handback", "finish", "report"):
                c.send("unit id", "POST", "/v1/workunits/%s/%s" % (i, verb), {"mb_done": 0}, tok)
            c.send("unit id", "GET", "/v1/workunits/%s/round?wait=0" % i, None, tok)
        for q in HOSTILE_QUERY:
            c.send("wait", "GET", "/v1/workunits/%d/round?wait=%s" % (wid, q), None, tok)
        for verb in ("heartbeat", "handback", "finish", "report"):
            c.send("another host's unit", "POST", "/v1/workunits/%d/%s" % (wid, verb),
                   {"mb_done": 0}, tok2)
            # a bad mb_done: the credentials the server accepts ("bearer")
            # must not end the unit
            c.auth_mutations("POST", "/v1/workunits/%d/%s" % (wid, verb), {"mb_done": -1}, kinds_host)
    c.batch("the scheduler, refused", scheduler)

    def heartbeats():
        # valid heartbeats are among these (mb_done 0 and 1): the unit stays live
        c.body_mutations("heartbeat", "POST", "/v1/workunits/%d/heartbeat" % wid,
                         {"mb_done": 0, "samples_per_sec": 1.0}, tok, [n_mb, n_mb + 1])
        # none of them a valid hand-back, which would end the unit
        c.body_mutations("handback", "POST", "/v1/workunits/%d/handback" % wid,
                         {"mb_done": -5}, tok, [n_mb + 1], skip=lambda v: isinstance(v, (int, float))
                         and not isinstance(v, bool) and 0 <= v <= n_mb, raw_json=False)
        c.body_mutations("finish", "POST", "/v1/workunits/%d/finish" % wid,
                         {"samples_per_sec": -1}, tok)
    c.batch("heartbeat, hand-back and finish of a live unit", heartbeats)

    # The unit is finished: the round reaches its target and closes.
    st, _, d = c.request("POST", "/v1/workunits/%d/finish" % wid, {"samples_per_sec": 10.0}, tok)
    fin = must(c, st, d, (200,), "finish")
    mbs = wu["microbatch_size"]
    k = (wu.get("sketch") or {}).get("k", 0)
    report = {"mb_done": n_mb, "samples": n_mb * mbs, "endpoint": "127.0.0.1:7070",
              "bandwidth": 1e6, "can_aggregate": True, "rtt": {str(hid2): 1.0}, "loss": 2.5}
    if k:
        # zeros, as the campaign's group sum will be: the check of the
        # averaged bytes against the committed sketches passes
        report["sketches"] = [[0.0] * k for _ in range(n_mb)]
    # wait for the close (the coordinator's straggler rule may take a moment)
    for _ in range(100):
        st, _, d = c.request("GET", "/v1/workunits/%d/round?wait=1" % wid, None, tok)
        if st == 200 and json.loads(d).get("round"):
            break

    def reports():
        c.body_mutations("report", "POST", "/v1/workunits/%d/report" % wid,
                         dict(report, mb_done=n_mb + 1), tok,
                         [{"1": -1}, {"x": 1}, {str(hid2): 1e7}, {str(i): 1 for i in range(5000)},
                          "999.0.0.1:1", "[::1", "127.0.0.1:99999", "127.0.0.1", "[2001:db8::5]:7070",
                          [[1e301] * max(k, 1)] * n_mb, [["x"] * max(k, 1)] * n_mb,
                          [[0.5] * (k + 1)] * n_mb, [[0.5] * max(k, 1)] * (n_mb + 1)])
    c.batch("report, refused (mb_done past the unit)", reports)

    st, _, d = c.request("POST", "/v1/workunits/%d/report" % wid, report, tok)
    must(c, st, d, (200,), "report")
    version = wu["version"]
    plan = None
    for _ in range(120):
        st, _, d = c.request("GET", "/v1/projects/%s/rounds/%d/plan?host_id=%d&wait=1" % (P, version, hid),
                             None, tok)
        if st == 200:
            plan = json.loads(d)
            break
        time.sleep(0.2)
    c.ok(plan is not None, "the round was planned after the unit's report")
    c.diag("plan: %s" % json.dumps(plan)[:300])
    base = "/v1/projects/%s/rounds/%d" % (P, version)

    def rounds():
        for q in HOSTILE_QUERY:
            c.send("host_id", "GET", "%s/plan?host_id=%s" % (base, q), None, tok)
            c.send("wait", "GET", "%s/plan?host_id=%d&wait=%s" % (base, hid, q), None, tok)
            c.send("after", "GET", "%s/plan?host_id=%d&after=%s" % (base, hid, q), None, tok)
            for route in ("group_sum", "mean_hash"):
                for field in ("host_id", "samples", "included", "sha256"):
                    qs = {"host_id": str(hid), "samples": str(n_mb * mbs), "included": str(hid),
                          "sha256": "0" * 64}
                    qs[field] = q
                    c.send(route + " " + field, "POST", "%s/%s?%s" % (base, route, "&".join(
                        "%s=%s" % kv for kv in qs.items())), b"\x00" * 16, tok,
                        ctype="application/octet-stream")
            c.send("checkpoint host_id", "POST", "%s/checkpoint?host_id=%s" % (base, q), b"x" * 64, tok,
                   ctype="application/octet-stream")
        for v in (i for i in HOSTILE_IDS if i != "0"):  # 0 is the round's: a failed outcome would fail it
            c.send("version", "GET", "/v1/projects/%s/rounds/%s/plan?host_id=%d" % (P, v, hid), None, tok)
            c.send("version", "POST", "/v1/projects/%s/rounds/%s/outcome" % (P, v),
                   {"host_id": hid, "status": "failed"}, tok)
        c.send("a group sum of the wrong size", "POST",
               "%s/group_sum?host_id=%d&samples=%d&included=%d" % (base, hid, n_mb * mbs, hid),
               b"\x00" * 12, tok, ctype="application/octet-stream")
        if plan:
            # the right size, a value that is not finite: refused, not kept
            # (the real sum after the batch must still be the group's)
            n = plan["param_count"]
            for what, data in [("NaN first", b"\x00\x00\xc0\x7f" + b"\x00" * (4 * n - 4)),
                               ("+Inf last", b"\x00" * (4 * n - 4) + b"\x00\x00\x80\x7f"),
                               ("-Inf in the middle", b"\x00" * (2 * n) + b"\x00\x00\x80\xff" +
                                b"\x00" * (2 * n - 4))]:
                st, _, _ = c.send("a group sum with " + what, "POST", "%s/group_sum?host_id=%d&samples=%d&included=%d"
                                  % (base, hid, n_mb * mbs, hid), data, tok, ctype="application/octet-stream")
                c.ok(st == 400, "a group sum with %s is refused 400 (%d)" % (what, st))
        c.send("a checkpoint that is not one", "POST", "%s/checkpoint?host_id=%d" % (base, hid),
               b"\x00" * 4096, tok, ctype="application/octet-stream")
        c.body_mutations("outcome", "POST", base + "/outcome",
                         {"host_id": hid, "status": "ok", "included_hosts": [hid], "params_sha256": "z" * 64,
                          "moments_sha256": "0" * 64,
                          "links": [{"peer": hid2, "rung": "direct", "connect_ms": 1.0, "plan": "punch"}]},
                         tok, ["dropped", "F" * 64, [hid, hid], [hid2], [hid] * 5000,
                               [{"peer": hid2, "rung": "x", "connect_ms": 1}],
                               [{"peer": hid2, "rung": "lan", "connect_ms": 1e9}],
                               [{"peer": hid2, "rung": "lan", "connect_ms": 1}] * 300])
        c.body_mutations("seed2", "POST", base + "/seed2",
                         {"host_id": hid, "sketches": {"k": k, "blocks": [{"first": 0, "count": -1,
                                                                        "sketch": [0.5] * k}]}}, tok)
        c.body_mutations("seed2 sketches", "POST", base + "/seed2",
                         {"host_id": hid, "sketches": {"k": k, "blocks": "x", "received": [],
                                                       "aggregated": {}}}, tok)
        c.body_mutations("claim", "POST", "/v1/projects/%s/spotchecks/claim" % P, {"host_id": hid}, tok)
        for i in HOSTILE_IDS + ["1"]:
            c.body_mutations("fingerprint", "POST", "/v1/spotchecks/%s/fingerprint" % i,
                             {"values": [0.5] * max(k, 1)}, tok) if i == "1" else \
                c.send("check id", "POST", "/v1/spotchecks/%s/fingerprint" % i, {"values": [1]}, tok)
        for i in HOSTILE_IDS:
            c.send("checkpoint sha", "GET", "/v1/projects/%s/checkpoints/%s" % (P, i), None, tok)
    c.batch("the round's routes, refused", rounds)

    # The round commits after all that: the lone peer's group sum, then its
    # outcome with the server's v+1.
    if plan:
        st, _, d = c.request("POST", "%s/group_sum?host_id=%d&samples=%d&included=%d" % (
            base, hid, n_mb * mbs, hid), b"\x00" * (4 * plan["param_count"]), tok,
            ctype="application/octet-stream")
        gs = must(c, st, d, (200,), "group_sum")
        st, _, d = c.request("POST", base + "/outcome", {"host_id": hid, "status": "ok", "included_hosts": [hid],
                                                         "params_sha256": gs.get("params_sha256")}, tok)
        out = must(c, st, d, (200,), "outcome")
        c.diag("group sum: %s\noutcome: %s" % (json.dumps(gs)[:300], json.dumps(out)[:400]))
        c.ok(out["round"]["state"] == "committed", "the round committed after the campaign's requests (%s)"
             % out["round"]["state"])

    # --- the committed round: its second seed, its spot check, its checkpoint -------
    st, _, d = c.request("POST", "/v1/accounts", {"email": "checker@example.org", "name": "checker",
                                                  "password": "a long password"})
    key3 = must(c, st, d, (201,), "POST /v1/accounts (a checker)")["account_key"]
    st, _, d = c.request("POST", "/v1/hosts", {"flops": 1e9}, key3)
    h3 = must(c, st, d, (201,), "POST /v1/hosts (the checker's)")
    hid3, tok3 = h3["host_id"], h3["host_token"]
    st, _, d = c.request("POST", "/v1/projects/%s/spotchecks/claim" % P, {"host_id": hid3}, tok3)
    check = json.loads(d) if st == 200 else None
    c.diag("spot check claimed: %s" % (json.dumps(check)[:300] if check else "none (%d)" % st))
    ckpt = out.get("checkpoint_sha256") if plan else None

    def committed():
        c.body_mutations("seed2", "POST", base + "/seed2",
                         {"host_id": hid, "sketches": {
                             "k": k, "blocks": [{"first": wu["lo"], "count": 0, "sketch": [0.0] * k}],
                             "received": [{"aggregator": hid, "sketch": [0.0] * k}],
                             "aggregated": {"members": [{"host_id": hid, "sketch": [0.0] * k, "err": 0.0}],
                                            "result": [0.0] * k, "result_err": 0.0}}}, tok)
        c.send("another host's seed2", "POST", base + "/seed2", {"host_id": hid3, "sketches": {"k": k}}, tok)
        if check:
            n_values = len(check.get("microbatches") or [None]) * check["k"] + (check["k"] if "seed2" in check
                                                                               else 0)
            c.body_mutations("fingerprint", "POST", "/v1/spotchecks/%d/fingerprint" % check["id"],
                             {"values": [0.5] * (n_values + 1)}, tok3,
                             [[0.5] * (n_values - 1), [1e308] * n_values, [None] * n_values,
                              ["1"] * n_values, [0.5] * 100000])
            c.send("a stranger's fingerprint", "POST", "/v1/spotchecks/%d/fingerprint" % check["id"],
                   {"values": [0.5] * n_values}, tok2)
        c.body_mutations("claim", "POST", "/v1/projects/%s/spotchecks/claim" % P, {"host_id": hid2}, tok3)
        if ckpt:
            c.send("a checkpoint's manifest, uppercase", "GET", "/v1/projects/%s/checkpoints/%s" % (P, ckpt.upper()),
                   None, tok)
            c.send("a checkpoint's manifest, another project", "GET", "/v1/projects/x/checkpoints/" + ckpt, None, tok)
            c.auth_mutations("GET", "/v1/projects/%s/checkpoints/%s" % (P, ckpt), None, kinds_host)
            for rng in ["bytes=0-0", "bytes=-1", "bytes=1000000000-", "bytes=0-1,5-6"]:
                c.send("a checkpoint's range", "GET", "/files/" + ckpt, headers={"Range": rng})
        c.send("the round again", "GET", "%s/plan?host_id=%d" % (base, hid), None, tok)
    c.batch("the committed round: second seed, spot check, checkpoint", committed)

    # --- one live unit raced: hand-backs, finishes and heartbeats at once ---------------
    st, _, d = c.request("POST", "/v1/projects/%s/work" % P, {"host_id": hid}, tok)
    wu2 = must(c, st, d, (200,), "POST /v1/projects/%s/work (the next version)" % P)
    wid2 = wu2["work_unit_id"]

    def race():
        verbs = ["handback"] * 8 + ["finish"] * 4 + ["heartbeat"] * 4
        start = threading.Barrier(len(verbs))
        got = []

        def one(verb):
            start.wait()
            path = "/v1/workunits/%d/%s" % (wid2, verb)
            st, hd, d = c.request("POST", path, {"mb_done": 0} if verb != "finish" else {}, tok)
            c.judge("race", "POST", path, st, hd, d)
            got.append((verb, st, d))
        threads = [threading.Thread(target=one, args=(v,)) for v in verbs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = {v for v, st, _ in got if st == 200 and v != "heartbeat"}
        c.ok(len(won) == 1, "of 8 hand-backs and 4 finishes sent at once, one kind won (%s)" % sorted(won))
        loser = {"handback": "finish", "finish": "handback"}.get(next(iter(won), ""), "")
        c.ok(all(st == 409 for v, st, _ in got if v == loser), "  the other kind was refused 409 (%s)" %
             sorted(st for v, st, _ in got if v == loser))
        bodies = {json.dumps({k: v for k, v in json.loads(d).items()
                              if k not in ("current_version", "accumulated_samples")}, sort_keys=True)
                  for v, st, d in got if st == 200 and v in won}
        c.ok(len(bodies) == 1, "  every winner was answered the same: the unit ended once (%d answers)" % len(bodies))
        c.ok(all(st in (200, 409) for v, st, _ in got if v == "heartbeat"),
             "  the heartbeats were answered 200 or 409 (%s)" % sorted(st for v, st, _ in got if v == "heartbeat"))
    c.batch("one unit raced", race)

    # --- a body past the limit, announced and not ----------------------------------
    def raw():
        port = args.port

        def raw_send(data):
            """data on a fresh connection: the start of the answer, b"" when
            the server closed or held it (waiting for a body announced) 1 s."""
            c.sent += 1
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            try:
                s.sendall(data)
                s.settimeout(1)
                return s.recv(65536)
            except (socket.timeout, OSError):
                return b""
            finally:
                s.close()
        for data in [b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                     b"GET /v1/projects HTTP/9.9\r\nHost: x\r\n\r\n",
                     b"GET " + b"/" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /v1/projects HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20000 + b"\r\n",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{}",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     b"1\r\n{\r\n" * 70000 + b"0\r\n\r\n",
                     b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"ffffffffffffffff\r\n{}\r\n0\r\n\r\n",
                     b"POST /v1/projects/" + P.encode() + b"/work HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
                     b"\r\n" * 1000, b"\x00" * 4096, b"GET /\x00/ HTTP/1.1\r\n\r\n"]:
            ans = raw_send(data)
            # (505: an HTTP version other than 1.x, as RFC 9110 says)
            if ans and not (ans.startswith(b"HTTP/1.") and (ans[9:10] in b"1234" or ans[9:12] == b"505")):
                c.problems.append("raw %r: answered %r" % (data[:40], ans[:60]))
        # a body over --body-limit announced: refused from its headers,
        # before it is sent
        head = raw_send(b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1048576\r\n\r\n")
        c.ok(head.startswith(b"HTTP/1.1 413"), "a 1 MiB account body is answered 413 from its length (%r)"
             % head[:40])
    c.batch("bytes that are not HTTP", raw)

    def nat_line(port, line):
        """One request line to the NAT service: its answer line (b"" when it
        closed without one, None when it held the connection 2 s)."""
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return b"(no connection)"
        try:
            s.sendall(line)
            s.settimeout(2)
            return s.recv(4096)
        except socket.timeout:
            return None
        except OSError:
            return b""
        finally:
            s.close()

    def nat():
        # each field of each request replaced by each hostile token (none
        # that would make a valid MEET or RELAY, which waits for its peer)
        good = {b"OBSERVE": [str(hid), tok, "127.0.0.1", "7070", "0"],
                b"MEET": [P, str(version), str(hid), str(hid2), tok, "DIAL"],
                b"RELAY": [P, str(version), str(hid), str(hid2), tok, "DIAL"]}
        tokens = ["-1", "0", "99999999999999999999", "abc", "A" * 400, "\x00", "\xff\xfe", "1e3", "+1",
                  "%", "::1", "[::1]", "65536", "-0", "dial", "\t", "9" * 30]
        lines = [b"", b"\n", b"OBSERVE\n", b"MEET\n", b"RELAY\n", b"A" * 100000 + b"\n",
                 b"\x00\xff\n" * 100, b" " * 446 + b"\n", b"OBSERVE " + b"1 " * 200 + b"\n"]
        for cmd, fields in good.items():
            for i in range(len(fields)):
                for t in tokens:
                    f = list(fields)
                    f[i] = t
                    lines.append(cmd + b" " + " ".join(f).encode("latin-1") + b"\r\n")
            lines.append(cmd + b" " + " ".join(fields).encode() + b" extra fields here\n")
        for line in lines:
            for port in (args.relay_port, args.relay_port + 1):
                c.sent += 1
                ans = nat_line(port, line)
                if ans is None and (line.startswith(b"MEET") or line.startswith(b"RELAY")):
                    continue  # a half that waits for its peer: the service's to time out
                if ans and ans.startswith(b"SEEN "):
                    c.changed_ok = True  # an observation: the host's reachability is stored
                elif ans and not ans.startswith(b"ERR 4"):
                    c.problems.append("NAT %r to port %d: answered %r" % (line[:60], port, ans[:100]))
        ans = nat_line(args.relay_port + 1, ("OBSERVE %d %s 127.0.0.1 7070 0\n" % (hid, tok)).encode())
        c.ok(ans is not None and ans.startswith(b"SEEN "), "the NAT service still observes a host after "
             "the hostile lines (%r)" % (ans or b"")[:60])
    if args.relay_port:
        c.batch("the NAT service's request lines", nat)

    # DELETE last: it revokes the second host.
    def delete():
        c.auth_mutations("DELETE", "/v1/hosts/%d" % hid2, None, kinds_acct)
        c.send("revoke", "DELETE", "/v1/hosts/%d" % hid2, None, KEY)
        c.send("revoke again", "DELETE", "/v1/hosts/%d" % hid2, None, KEY)
        c.send("a revoked host's token", "POST", "/v1/projects/%s/work" % P, {"host_id": hid2}, tok2)
    c.batch("revoking a host", delete)

    c.diag("%d requests in all" % c.sent)
    print("1..%d" % c.n)
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
