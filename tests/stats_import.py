#!/usr/bin/env python3
"""cotrain tests: read the stats export the way BOINC stats sites read
db_dump (tests/test_stats_export.sh).

  stats_import.py DIR EXPECT.json   check DIR against what was put in
  stats_import.py --reader DIR FLAG read DIR in a loop while FLAG exists

Every file is parsed by xml.etree (strict: not well-formed is an error).
Fields are read by the names BOINC's db_dump writes (sched/db_dump.cpp):
text is BOINC's xml_escape() output, bytes above 127 as character
references, so the importer maps the parsed characters back to bytes
(latin-1) and decodes UTF-8, as stats sites do.  Exit status 1 on the
first failed check, with the reason on stderr."""
import gzip, hashlib, json, os, re, sys, time
import xml.etree.ElementTree as ET

FILES = ['tables.xml', 'db_dump.xml', 'user.gz', 'team.gz', 'host.gz',
         'user_deleted.gz', 'host_deleted.gz']
HOST_DETAIL = ['create_time', 'rpc_time', 'timezone', 'ncpus', 'p_fpops', 'p_iops',
               'p_membw', 'm_nbytes', 'm_cache', 'm_swap', 'd_total', 'd_free', 'n_bwup',
               'n_bwdown', 'avg_turnaround', 'credit_per_cpu_sec', 'host_cpid']
FLOAT = re.compile(r'^-?[0-9]+\.[0-9]{6}$')
INT = re.compile(r'^-?[0-9]+$')
HEX32 = re.compile(r'^[0-9a-f]{32}$')


def fail(msg):
    sys.stderr.write('stats_import: ' + msg + '\n')
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def read(d, name):
    with open(os.path.join(d, name), 'rb') as f:
        raw = f.read()
    return gzip.decompress(raw) if name.endswith('.gz') else raw


def boinc_text(el):
    """The text of an element as a BOINC importer gets it: references of
    bytes back to bytes, then UTF-8."""
    t = el.text or ''
    return t.encode('latin-1').decode('utf-8')


def fields(el):
    return {c.tag: c for c in el}


def num(el, tag, pattern=FLOAT):
    t = el.find(tag)
    check(t is not None, '<%s> has no <%s>' % (el.tag, tag))
    check(pattern.match(t.text or ''), '<%s><%s> is %r, not as BOINC writes it' % (el.tag, tag, t.text))
    return float(t.text)


def exported(s):
    """What the export makes of stored text: U+FFFE/U+FFFF as U+FFFD, control
    characters other than tab, newline and CR dropped."""
    s = s.replace('\ufffe', '\ufffd').replace('\uffff', '\ufffd')
    return ''.join(c for c in s if c >= ' ' or c in '\t\n\r')


def close(a, b):
    return abs(a - b) <= 5e-7 + 1e-12 * abs(b)


def conventions(name, raw):
    """Byte conventions of xml_escape and db_dump."""
    check(raw.startswith(b'<?xml version="1.0" encoding="utf-8"?>\n') or name == 'db_dump.xml',
          '%s does not start with the XML declaration' % name)
    check(all(b < 128 for b in raw), '%s has raw non-ASCII bytes, not &#N; references' % name)
    for ent in (b'&apos;', b'&quot;'):
        check(ent not in raw, '%s has %s, which xml_escape never writes' % (name, ent.decode()))
    for m in re.finditer(rb'&gt;', raw):
        check(raw[m.start() - 2:m.start()] == b']]', '%s has &gt; outside "]]&gt;"' % name)
    check(not re.search(rb'[0-9]e[+-][0-9]', raw), '%s has a number in exponent form' % name)


def check_dir(d, expect):
    docs = {}
    for name in FILES:
        raw = read(d, name)
        conventions(name, raw)
        try:
            docs[name] = ET.fromstring(raw)
        except ET.ParseError as e:
            fail('%s is not well-formed: %s' % (name, e))

    # user.gz
    users = docs['user.gz']
    check(users.tag == 'users', 'user.gz root is <%s>' % users.tag)
    want = {u['id']: u for u in expect['users']}
    got = users.findall('user')
    check(sorted(int(u.find('id').text) for u in got) == sorted(want),
          'users %s, expected %s' % ([u.find('id').text for u in got], sorted(want)))
    total = 0.0
    for u in got:
        f = fields(u)
        w = want[int(f['id'].text)]
        check(boinc_text(f['name']) == exported(w['name']),
              'user %d name %r, expected %r' % (w['id'], boinc_text(f['name']), exported(w['name'])))
        check(INT.match(f['create_time'].text), 'user create_time')
        t = num(u, 'total_credit')
        check(t > 0 and close(t, w['total']), 'user %d total_credit %s' % (w['id'], t))
        total += t
        num(u, 'expavg_credit')
        num(u, 'expavg_time')
        cpid = hashlib.md5((w['xpid'] + w['email']).encode()).hexdigest()
        check(f['cpid'].text == cpid, 'user %d cpid %s, expected md5(cross_project_id || email) %s'
              % (w['id'], f['cpid'].text, cpid))
        if w['team'] is None:
            check('teamid' not in f, 'teamless user %d has <teamid>' % w['id'])
        else:
            check(f['teamid'].text == str(w['team']), 'user %d teamid' % w['id'])
        check('has_profile' not in f, 'user %d has <has_profile/> without a profile' % w['id'])
        for tag in ('country', 'url'):
            check(tag not in f, 'user %d has an empty <%s>' % (w['id'], tag))
        check(set(f) <= {'id', 'name', 'create_time', 'total_credit', 'expavg_credit',
                         'expavg_time', 'cpid', 'teamid'}, 'user fields %s' % sorted(f))
    bob = [u for u in got if u.find('cpid').text == expect['bob_cpid']]
    check(len(bob) == 1, 'no user carries the cpid of the cross-project id bob entered')

    # team.gz
    teams = docs['team.gz']
    wantt = {t['id']: t for t in expect['teams']}
    gott = teams.findall('team')
    check(sorted(int(t.find('id').text) for t in gott) == sorted(wantt), 'teams')
    deleted_ids = {u['id'] for u in expect['users_deleted']}
    for t in gott:
        f = fields(t)
        w = wantt[int(f['id'].text)]
        check(f['type'].text == '1', 'team type %s, not 1 ("None")' % f['type'].text)
        check(boinc_text(f['name']) == exported(w['name']), 'team name %r' % boinc_text(f['name']))
        check(boinc_text(f['description']) == exported(w['description']), 'team description')
        num(t, 'total_credit')
        if w['founder'] in deleted_ids:
            check('founder_name' not in f, 'a disabled founder is named')
        check('country' in f, 'team without <country>')
        check('nusers' not in f, 'team with <nusers>, which db_dump does not write')

    # host.gz
    hosts = docs['host.gz']
    wanth = {h['id']: h for h in expect['hosts']}
    goth = hosts.findall('host')
    check(sorted(int(h.find('id').text) for h in goth) == sorted(wanth),
          'hosts %s, expected %s' % ([h.find('id').text for h in goth], sorted(wanth)))
    for h in goth:
        f = fields(h)
        w = wanth[int(f['id'].text)]
        if w['show']:
            check(f.get('userid') is not None and f['userid'].text == str(w['owner']),
                  'host %d: no <userid> though its owner shows hosts' % w['id'])
        else:
            check('userid' not in f, 'host %d: <userid> though its owner hides hosts' % w['id'])
        check(boinc_text(f['p_model']) == exported(w['model']), 'host %d p_model %r'
              % (w['id'], boinc_text(f['p_model'])))
        check(boinc_text(f['os_version']) == exported(w['os_version']), 'host os_version')
        for tag in ['p_vendor', 'os_name', 'misc'] + HOST_DETAIL:
            check(tag in f, 'host %d has no <%s>' % (w['id'], tag))
        check('p_ncpus' not in f and 'coprocs' not in f, 'host fields db_dump does not write')
        check(f['ncpus'].text == str(w['cores']), 'host ncpus')
        check(close(num(h, 'p_fpops'), w['flops'] / w['cores']), 'host %d p_fpops is not per CPU' % w['id'])
        check(close(num(h, 'total_credit'), w['total']), 'host total_credit')
        for tag in HOST_DETAIL:
            if tag not in ('create_time', 'rpc_time', 'timezone', 'ncpus', 'host_cpid'):
                num(h, tag)
        check(f['host_cpid'].text == w['cpid'], 'host %d host_cpid %s, expected %s'
              % (w['id'], f['host_cpid'].text, w['cpid']))

    # user_deleted.gz, host_deleted.gz
    ud = docs['user_deleted.gz']
    check(ud.tag == 'users_deleted', 'user_deleted.gz root')
    check(sorted((int(u.find('id').text), u.find('cpid').text) for u in ud.findall('user')) ==
          sorted((u['id'], u['cpid']) for u in expect['users_deleted']), 'user_deleted rows')
    hd = docs['host_deleted.gz']
    check(hd.tag == 'hosts_deleted', 'host_deleted.gz root')
    check(sorted(int(h.find('id').text) for h in hd.findall('host')) == sorted(expect['hosts_deleted']),
          'host_deleted rows %s, expected %s' % ([h.find('id').text for h in hd.findall('host')],
                                                  expect['hosts_deleted']))
    check(all(HEX32.match(h.find('host_cpid').text) for h in hd.findall('host')), 'host_deleted cpid')

    # tables.xml
    t = docs['tables.xml']
    def count(tag):
        e = t.find(tag)
        return int(e.text) if e is not None else 0
    check(INT.match(t.find('update_time').text), 'update_time')
    check(count('nusers_total') == len(got), 'nusers_total')
    check(count('nteams_total') == len(gott), 'nteams_total')
    check(count('nhosts_total') == len(goth), 'nhosts_total')
    check(count('nusers_deleted_total') == len(expect['users_deleted']), 'nusers_deleted_total')
    check(count('nhosts_deleted_total') == len(expect['hosts_deleted']), 'nhosts_deleted_total')
    check(abs(num(t, 'total_credit') - total) < 1e-5, 'total_credit')
    check([boinc_text(a.find('name')) for a in t.find('applications')] == expect['projects'],
          'applications')
    check(t.find('badges') is not None, 'tables.xml has no <badges>')

    spec = docs['db_dump.xml']
    check(spec.tag == 'boinc_db_dump_spec' and
          sorted(e.find('table').text for e in spec.findall('enumeration')) ==
          ['host', 'host_deleted', 'team', 'user', 'user_deleted'], 'db_dump.xml')
    print('%d users, %d teams, %d hosts, %d deleted users, %d deleted hosts, total credit %.6f: ok'
          % (len(got), len(gott), len(goth), len(ud), len(hd), total))


def reader(d, flag):
    """Read every file of d, by path, until flag is gone; report what went
    wrong.  Needs to have seen at least two generations (folder inodes)."""
    reads, probes, errors, gens = 0, 0, [], set()
    while os.path.exists(flag) or reads == 0:
        try:
            gens.add(os.stat(d).st_ino)
        except OSError as e:
            errors.append('stat: %s' % e)
        for name in FILES:
            try:
                ET.fromstring(read(d, name))
                reads += 1
            except (OSError, EOFError, ET.ParseError) as e:
                errors.append('%s: %s: %s' % (name, type(e).__name__, e))
        # Between whole reads, open by path as fast as Python can: a swap
        # that leaves the name missing for microseconds shows here.
        path = os.path.join(d, 'tables.xml')
        for i in range(20000):
            if i % 500 == 0:
                try:
                    gens.add(os.stat(d).st_ino)
                except OSError as e:
                    errors.append('stat: %s' % e)
            try:
                os.close(os.open(path, os.O_RDONLY))
                probes += 1
            except OSError as e:
                errors.append('tables.xml: %s' % e)
    for e in errors[:5]:
        print(e)
    print('%d files read and %d opened over %d generations, %d missing or partial'
          % (reads, probes, len(gens), len(errors)))
    sys.exit(0 if not errors and len(gens) >= 2 else 1)


if __name__ == '__main__':
    if sys.argv[1] == '--reader':
        reader(sys.argv[2], sys.argv[3])
    else:
        check_dir(sys.argv[1], json.load(open(sys.argv[2])))
