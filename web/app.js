/* cotrain web site: every page's script.  Data comes from the JSON API
 * (/api/v1/...); the DOM is built with createElement and textContent only,
 * never innerHTML, so names and descriptions that users typed show as text
 * whatever they contain.  No external code: plots are drawn on <canvas>. */
'use strict';

const API = '/api/v1';

/* el('td', {class: 'num'}, 'text' | node, ...): an element with attributes
 * set by setAttribute and children appended as text nodes or nodes. */
function el(tag, attrs, ...kids) {
	const e = document.createElement(tag);
	for (const [k, v] of Object.entries(attrs || {}))
		if (v !== null && v !== undefined)
			e.setAttribute(k, String(v));
	for (const k of kids) {
		if (k === null || k === undefined)
			continue;
		e.appendChild(typeof k === 'object' ? k : document.createTextNode(String(k)));
	}
	return e;
}

/* User-typed text: isolated from the surrounding text direction (<bdi>),
 * cut to a sane length for display; the full text stays in the title. */
function utext(s, max) {
	s = s === null || s === undefined ? '' : String(s);
	max = max || 80;
	const shown = Array.from(s);
	const b = el('bdi', { title: s.length > max ? s : null },
	             shown.length > max ? shown.slice(0, max).join('') + '…' : s);
	return b;
}

function link(href, ...kids) { return el('a', { href: href }, ...kids); }

function fmtNum(x, digits) {
	if (x === null || x === undefined || !isFinite(x))
		return '–';
	return Number(x).toLocaleString('en-US', { maximumFractionDigits: digits === undefined ? 2 : digits });
}

function fmtTime(s) {
	if (!s)
		return '–';
	const d = new Date(s);
	return isNaN(d) ? '–' : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
}

async function getJSON(path) {
	const r = await fetch(API + path, { headers: { Accept: 'application/json' } });
	let body = null;
	try { body = await r.json(); } catch (e) { body = null; }
	if (!r.ok) {
		const msg = body && body.error ? body.error.message : 'HTTP ' + r.status;
		throw new Error(msg);
	}
	return body;
}

function param(name) { return new URLSearchParams(location.search).get(name); }

function setMain(...kids) {
	const m = document.getElementById('main');
	m.replaceChildren(...kids);
}

function fail(e) {
	setMain(el('p', { class: 'error', id: 'status' }, 'Could not load: ' + e.message));
}

/* A line plot of points [{x, y}] on a canvas, with axes and labels.  Sets
 * data-points on the canvas once drawn (tests look for it). */
function plot(title, points, opts) {
	opts = opts || {};
	const c = el('canvas', { class: 'plot', role: 'img', 'aria-label': title });
	const wrap = el('div', { class: 'card' }, el('h3', {}, title), c);
	requestAnimationFrame(() => drawPlot(c, points, opts));
	return wrap;
}

function drawPlot(c, points, opts) {
	const dpr = window.devicePixelRatio || 1;
	const w = c.clientWidth || 480, h = c.clientHeight || 240;
	c.width = w * dpr;
	c.height = h * dpr;
	const g = c.getContext('2d');
	g.scale(dpr, dpr);
	g.fillStyle = '#fff';
	g.fillRect(0, 0, w, h);
	const pts = points.filter(p => isFinite(p.x) && isFinite(p.y));
	/* opts.second: {points, color, label}, a second curve on the same axes
	 * (the held-out loss beside the training loss) */
	const pts2 = opts.second ? opts.second.points.filter(p => isFinite(p.x) && isFinite(p.y)) : [];
	const all = pts.concat(pts2);
	const L = 56, R = 12, T = 10, B = 28;
	g.strokeStyle = '#9aa5b1';
	g.lineWidth = 1;
	g.beginPath();
	g.moveTo(L, T);
	g.lineTo(L, h - B);
	g.lineTo(w - R, h - B);
	g.stroke();
	g.fillStyle = '#5b6570';
	g.font = '11px sans-serif';
	if (opts.second)
		c.setAttribute('data-points-2', String(pts2.length));
	if (all.length === 0) {
		g.fillText('no data yet', L + 10, T + 20);
		c.setAttribute('data-points', '0');
		return;
	}
	let x0 = Math.min(...all.map(p => p.x)), x1 = Math.max(...all.map(p => p.x));
	let y0 = Math.min(...all.map(p => p.y)), y1 = Math.max(...all.map(p => p.y));
	if (opts.zero)
		y0 = Math.min(0, y0);
	if (x1 === x0) { x0 -= 1; x1 += 1; }
	if (y1 === y0) { y0 -= 1; y1 += 1; }
	const X = x => L + (x - x0) / (x1 - x0) * (w - L - R);
	const Y = y => h - B - (y - y0) / (y1 - y0) * (h - T - B);
	for (let i = 0; i <= 4; i++) {
		const yv = y0 + (y1 - y0) * i / 4;
		g.fillText(fmtNum(yv, 3), 4, Y(yv) + 4);
		g.strokeStyle = '#eef1f4';
		g.beginPath();
		g.moveTo(L + 1, Y(yv));
		g.lineTo(w - R, Y(yv));
		g.stroke();
	}
	g.fillText(String(x0), L, h - 8);
	g.fillText(String(x1), w - R - 30, h - 8);
	g.fillText(opts.xlabel || 'model version', (L + w) / 2 - 30, h - 8);
	const curve = (cp, color) => {
		g.strokeStyle = color;
		g.lineWidth = 2;
		g.beginPath();
		cp.forEach((p, i) => (i ? g.lineTo(X(p.x), Y(p.y)) : g.moveTo(X(p.x), Y(p.y))));
		g.stroke();
		g.fillStyle = color;
		for (const p of cp) {
			g.beginPath();
			g.arc(X(p.x), Y(p.y), 2.5, 0, 2 * Math.PI);
			g.fill();
		}
	};
	curve(pts, opts.color || '#2b6cb0');
	if (opts.second) {
		curve(pts2, opts.second.color);
		g.font = '11px sans-serif';
		g.fillStyle = opts.color || '#2b6cb0';
		g.fillText('— ' + (opts.label || ''), w - R - 150, T + 12);
		g.fillStyle = opts.second.color;
		g.fillText('— ' + opts.second.label, w - R - 150, T + 26);
	}
	c.setAttribute('data-points', String(pts.length));
}

function stat(k, v) { return el('div', { class: 'stat' }, el('div', { class: 'v' }, v), el('div', { class: 'k' }, k)); }

async function projectName() {
	const p = param('project');
	if (p)
		return p;
	const list = await getJSON('/projects');
	if (!list.projects.length)
		throw new Error('this server has no project yet');
	return list.projects[0].name;
}

/* What a project's model is and what it learns, by model.arch (absent: the
 * GPT); doc/model.md. */
const ARCHS = {
	albert: { model: 'an ALBERT encoder', objective: 'masked LM + sentence order' },
	bert: { model: 'a BERT encoder', objective: 'masked LM + sentence order' },
};
const GPT_ARCH = { model: 'a GPT-style decoder', objective: 'next token' };
const archOf = m => (m && Object.prototype.hasOwnProperty.call(ARCHS, m.arch) ? ARCHS[m.arch] : GPT_ARCH);

/* The project page: what is trained, on what, how to join. */
async function pageIndex() {
	const name = await projectName();
	const d = await getJSON('/projects/' + encodeURIComponent(name) + '/dashboard?rounds=1');
	const url = location.origin;
	const m = d.model || {};
	document.title = d.title;
	setMain(
		el('h1', {}, utext(d.title, 200)),
		el('div', { class: 'card' },
		   el('p', { class: 'desc' }, utext(d.description, 10000)),
		   el('p', {}, 'Model: ', archOf(m).model, ' (objective: ', archOf(m).objective, '), ',
		      fmtNum(m.n_layer, 0), ' layers of width ',
		      fmtNum(m.d_model, 0), ', ', fmtNum(m.n_head, 0), ' heads, sequence ', fmtNum(d.seq_len, 0),
		      ' tokens; ', fmtNum(d.flops_per_sample / 1e9, 3), ' GFLOP per sample; global batch ',
		      fmtNum(d.target_batch, 0), ' samples.'),
		   el('p', {}, 'Data: the dataset ', el('code', {}, utext(d.dataset)), ', ',
		      fmtNum(d.n_tokens, 0), ' tokens (', utext(d.tokenizer), ' tokenizer).'),
		   el('p', {}, 'Model version ', fmtNum(d.current_version, 0), '; ',
		      fmtNum(d.active_hosts, 0), ' hosts training now. ',
		      link('/dashboard?project=' + encodeURIComponent(d.project), 'Training dashboard'), ' · ',
		      link('/leaderboard', 'Leaderboards'))),
		el('h2', {}, 'Join'),
		el('div', { class: 'card' },
		   el('p', {}, '1. Install the client (Debian 12):'),
		   el('pre', {}, 'sudo apt install ./cotrain-client_*.deb    # or build: ./configure && make && sudo make install\nsudo systemctl enable --now cotrain-client'),
		   el('p', {}, '2. Create an account, then attach the client with your account key:'),
		   el('pre', {}, 'curl -s -X POST ' + url + '/v1/accounts -d \'{"email": "you@example.org", "name": "you", "password": "…"}\'\ncotrainctl attach ' + url + '/projects/' + d.project + ' --key YOUR_ACCOUNT_KEY\n# or: echo "$PASSWORD" | cotrainctl attach ' + url + '/projects/' + d.project + ' --email you@example.org --password-stdin'),
		   el('p', {}, '3. Watch it work: ', el('code', {}, 'cotrainctl status'), '. It computes only when the machine is idle and obeys your preferences.')));
}

async function pageDashboard() {
	const name = await projectName();
	const load = async () => {
		const d = await getJSON('/projects/' + encodeURIComponent(name) + '/dashboard?rounds=500');
		const rounds = d.rounds.slice().reverse();
		const done = rounds.filter(r => r.state === 'committed');
		const cur = rounds.length ? rounds[rounds.length - 1] : null;
		const last = done.length ? done[done.length - 1] : null;
		const evald = rounds.filter(r => r.heldout_bpb !== null && r.heldout_bpb !== undefined);
		/* bits per byte with the byte tokenizer, per token with a subword one */
		const unit = d.tokenizer === 'byte' ? 'byte' : 'token';
		const arch = archOf(d.model);
		/* a GPT's loss in bits per byte (byte tokenizer) or token beside the
		 * held-out figure; an encoder's MLM + SOP loss in nats, which
		 * the held-out evaluation does not measure */
		const lossPlot = arch === GPT_ARCH
			? plot('Loss (bits per ' + unit + ')', done.filter(r => r.loss !== null && r.loss !== undefined).map(r => ({ x: r.version, y: Number(r.loss) / Math.LN2 })),
			       { label: 'training', second: { label: 'held-out', color: '#c53030', points: evald.map(r => ({ x: r.version, y: Number(r.heldout_bpb) })) } })
			: plot('Loss (' + arch.objective + ', nats)', done.filter(r => r.loss !== null && r.loss !== undefined).map(r => ({ x: r.version, y: Number(r.loss) })),
			       { label: 'training' });
		setMain(
			el('h1', {}, utext(d.title, 200), ' — training'),
			el('div', { class: 'stats' },
			   stat('objective', arch.objective),
			   stat('model version', fmtNum(d.current_version, 0)),
			   stat('active peers', fmtNum(d.active_hosts, 0)),
			   stat('samples / s now', fmtNum(d.samples_per_sec, 1)),
			   stat('last loss', last && last.loss !== null ? fmtNum(last.loss, 4) : '–'),
			   stat('held-out bits / ' + unit, evald.length ? fmtNum(evald[evald.length - 1].heldout_bpb, 4) + ' (v' + evald[evald.length - 1].version + ')' : '–'),
			   stat('last round', last && last.seconds ? fmtNum(last.seconds, 1) + ' s' : '–'),
			   stat('round ' + (cur ? cur.version : '–'), cur ? cur.state : '–')),
			el('div', { class: 'plots', id: 'plots' },
			   /* a GPT's: both in bits per byte (byte tokenizer) or token,
			    * the training loss the peers reported, in nats, over ln 2,
			    * and the held-out figure of the same model version,
			    * computed by the server */
			   lossPlot,
			   plot('Samples per second (per round)', done.filter(r => r.seconds > 0).map(r => ({ x: r.version, y: r.samples / r.seconds })), { zero: true, color: '#2f855a' }),
			   plot('Time per round (s)', done.filter(r => r.seconds > 0).map(r => ({ x: r.version, y: r.seconds })), { zero: true, color: '#b7791f' }),
			   plot('Peers per round', done.map(r => ({ x: r.version, y: r.n_peers })), { zero: true, color: '#6b46c1' })),
			el('p', {}, 'Updated ', fmtTime(new Date().toISOString()), '; refreshes every 15 s.'));
	};
	await load();
	setInterval(() => load().catch(() => {}), 15000);
}

const KINDS = { users: 'Users', teams: 'Teams', hosts: 'Hosts' };

async function pageLeaderboard() {
	const kind = KINDS[param('kind')] ? param('kind') : 'users';
	const order = param('order') === 'rac' ? 'rac' : 'total';
	const after = param('after');
	let q = '/credit/' + kind + '?order=' + order + '&limit=50';
	if (after)
		q += '&after=' + encodeURIComponent(after);
	const d = await getJSON(q);
	const tabs = el('p', { class: 'tabs' });
	for (const k of Object.keys(KINDS))
		tabs.appendChild(el('a', { href: '/leaderboard?kind=' + k + '&order=' + order, class: k === kind ? 'on' : null }, KINDS[k]));
	tabs.appendChild(document.createTextNode(' · by '));
	for (const o of ['total', 'rac'])
		tabs.appendChild(el('a', { href: '/leaderboard?kind=' + kind + '&order=' + o, class: o === order ? 'on' : null }, o === 'rac' ? 'recent average' : 'total'));
	const head = el('tr', {}, el('th', { class: 'rank' }, '#'), el('th', {}, 'Name'));
	if (kind === 'users')
		head.appendChild(el('th', {}, 'Team'));
	if (kind === 'hosts')
		head.append(el('th', {}, 'Owner'), el('th', {}, 'CPU'));
	head.append(el('th', { class: 'num' }, 'Total credit'), el('th', { class: 'num' }, 'Pending'), el('th', { class: 'num' }, 'Recent average'));
	const body = el('tbody', { id: 'rows' });
	const single = { users: 'user', teams: 'team', hosts: 'host' }[kind];
	for (const r of d.rows) {
		const tr = el('tr', { class: 'row' }, el('td', { class: 'rank' }, r.rank),
		              el('td', {}, link('/' + single + '?id=' + r.id, kind === 'hosts' ? 'host ' + r.id : utext(r.name))));
		if (kind === 'users')
			tr.appendChild(el('td', {}, r.team_id ? link('/team?id=' + r.team_id, utext(r.team_name)) : ''));
		if (kind === 'hosts')
			tr.append(el('td', {}, link('/user?id=' + r.owner_id, utext(r.owner_name))), el('td', {}, utext(r.cpu_model)));
		tr.append(el('td', { class: 'num' }, fmtNum(r.total_credit)), el('td', { class: 'num' }, fmtNum(r.pending_credit)),
		          el('td', { class: 'num' }, fmtNum(r.expavg_credit)));
		body.appendChild(tr);
	}
	const pager = el('nav', { class: 'pager' });
	if (after)
		pager.appendChild(link('/leaderboard?kind=' + kind + '&order=' + order, '« first page'));
	if (d.next)
		pager.append(' ', link('/leaderboard?kind=' + kind + '&order=' + order + '&after=' + encodeURIComponent(d.next), 'next page »'));
	setMain(el('h1', {}, KINDS[kind], ' by ', order === 'rac' ? 'recent average credit' : 'total credit'), tabs,
	        d.rows.length ? el('table', {}, el('thead', {}, head), body) : el('p', {}, 'No credit granted yet.'),
	        pager,
	        el('p', {}, 'One credit is 4.32e11 floating-point operations of validated training; the recent average decays with a one-week half-life.'));
}

function grantsTable(grants) {
	if (!grants.length)
		return el('p', {}, 'No grants yet.');
	const body = el('tbody', {});
	for (const g of grants)
		body.appendChild(el('tr', {}, el('td', {}, fmtTime(g.granted_at || g.created_at)),
		                    el('td', {}, utext(g.project)), el('td', { class: 'num' }, g.version),
		                    el('td', {}, g.kind), el('td', { class: 'num' }, fmtNum(g.samples, 0)),
		                    el('td', { class: 'num' }, fmtNum(g.credit, 4)),
		                    el('td', { title: g.reason || null }, g.status)));
	return el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'When'), el('th', {}, 'Project'),
	          el('th', { class: 'num' }, 'Version'), el('th', {}, 'For'), el('th', { class: 'num' }, 'Samples'),
	          el('th', { class: 'num' }, 'Credit'), el('th', {}, 'Status'))), body);
}

function idParam() {
	const id = param('id');
	if (!id || !/^[1-9][0-9]{0,17}$/.test(id))
		throw new Error('the page needs ?id= with a positive number');
	return id;
}

async function pageUser() {
	const u = await getJSON('/credit/users/' + idParam());
	const hosts = el('tbody', {});
	for (const h of u.hosts)
		hosts.appendChild(el('tr', {}, el('td', {}, link('/host?id=' + h.id, 'host ' + h.id)), el('td', {}, utext(h.cpu_model)),
		                     el('td', {}, utext(h.os_name)), el('td', { class: 'num' }, fmtNum(h.total_credit)),
		                     el('td', { class: 'num' }, fmtNum(h.pending_credit)),
		                     el('td', { class: 'num' }, fmtNum(h.expavg_credit))));
	document.title = 'User ' + u.id;
	setMain(el('h1', { id: 'name' }, utext(u.name, 100)),
	        el('div', { class: 'stats' }, stat('total credit', fmtNum(u.total_credit)), stat('pending', fmtNum(u.pending_credit)),
	           stat('recent average', fmtNum(u.expavg_credit)),
	           stat('team', u.team_id ? link('/team?id=' + u.team_id, utext(u.team_name)) : 'none'),
	           stat('member since', fmtTime(u.created_at).slice(0, 10))),
	        el('h2', {}, 'Hosts'),
	        el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'Host'), el('th', {}, 'CPU'), el('th', {}, 'OS'),
	           el('th', { class: 'num' }, 'Total'), el('th', { class: 'num' }, 'Pending'), el('th', { class: 'num' }, 'Recent average'))), hosts),
	        el('h2', {}, 'Recent grants'), grantsTable(u.grants));
}

async function pageTeam() {
	const t = await getJSON('/credit/teams/' + idParam());
	const members = el('tbody', {});
	t.members.forEach((m, i) => members.appendChild(el('tr', { class: 'row' }, el('td', { class: 'rank' }, i + 1),
	                   el('td', {}, link('/user?id=' + m.id, utext(m.name))), el('td', { class: 'num' }, fmtNum(m.total_credit)),
	                   el('td', { class: 'num' }, fmtNum(m.expavg_credit)))));
	document.title = 'Team ' + t.id;
	setMain(el('h1', { id: 'name' }, utext(t.name, 100)),
	        el('p', { class: 'desc' }, utext(t.description, 4000)),
	        el('div', { class: 'stats' }, stat('total credit', fmtNum(t.total_credit)), stat('pending', fmtNum(t.pending_credit)),
	           stat('recent average', fmtNum(t.expavg_credit)),
	           stat('members', fmtNum(t.n_members, 0)),
	           stat('founder', t.founder_id ? link('/user?id=' + t.founder_id, utext(t.founder_name)) : '–')),
	        el('h2', {}, 'Members'),
	        el('table', {}, el('thead', {}, el('tr', {}, el('th', { class: 'rank' }, '#'), el('th', {}, 'Name'),
	           el('th', { class: 'num' }, 'Total'), el('th', { class: 'num' }, 'Recent average'))), members),
	        el('h2', {}, 'Recent grants'), grantsTable(t.grants));
}

function fmtBytes(n) {
	if (n === null || n === undefined || !isFinite(n))
		return '–';
	const u = ['B', 'KB', 'MB', 'GB', 'TB'];
	let i = 0;
	for (n = Number(n); n >= 1000 && i < u.length - 1; i++)
		n /= 1000;
	return fmtNum(n, i ? 1 : 0) + ' ' + u[i];
}

const CLASS_TEXT = { public: 'public (can be dialed)', mapped: 'port mapped (can be dialed)',
                     nat: 'behind NAT', unknown: 'not yet known' };

/* The host's network position and the rungs of its connections, from
 * /api/v1/hosts/{id}/network (public: no address in it). */
function hostNetwork(n) {
	const r = n.reachability || {}, l = n.links || {};
	const last = l.last_20_rounds || {};
	const rows = el('tbody', {});
	const add = (list, dir) => {
		for (const c of list || [])
			rows.appendChild(el('tr', { class: 'link' }, el('td', {}, link('/host?id=' + c.peer, 'host ' + c.peer)),
			                    el('td', {}, dir), el('td', { class: 'rung' }, String(c.rung)),
			                    el('td', { class: 'num' }, fmtNum(c.connect_ms, 1))));
	};
	add(l.dialed, 'dialed');
	add(l.accepted, 'dialed by');
	const round = l.version === null || l.version === undefined ? null
	            : el('p', { id: 'links-round' }, 'Connections of round ', fmtNum(l.version, 0), ' of ', utext(l.project), ':');
	return el('div', { id: 'network' },
	          el('h2', {}, 'Network'),
	          el('div', { class: 'stats', id: 'reachability' },
	             stat('reachability', CLASS_TEXT[r.class] || utext(r.class)),
	             stat('NAT mapping', utext(r.mapping)),
	             stat('relayed from it', fmtBytes(r.relay_bytes_in)),
	             stat('relayed to it', fmtBytes(r.relay_bytes_out)),
	             stat('observed', fmtTime(r.observed_at))),
	          round || el('p', { id: 'links-round' }, 'No connections reported yet.'),
	          round ? el('table', { id: 'links' }, el('thead', {}, el('tr', {}, el('th', {}, 'Peer'), el('th', {}, 'Direction'),
	                     el('th', {}, 'Rung'), el('th', { class: 'num' }, 'Connect ms'))), rows) : null,
	          el('p', { id: 'rungs' }, 'Connections it dialed over its latest ', fmtNum(last.rounds, 0), ' rounds: ',
	             fmtNum(last.lan || 0, 0), ' in its household, ',
	             fmtNum(last.direct, 0), ' direct, ', fmtNum(last.punch, 0), ' punched, ',
	             fmtNum(last.relay, 0), ' relayed.'),
	          historyNote(l.history));
}

/* What the NAT service plans from history (doc/nat.md): the host's failed
 * punches in a row, and the pairs whose punch or household dial it skips. */
function historyNote(h) {
	if (!h || (!h.failed_punches && !(h.pairs || []).length))
		return null;
	const skipped = (h.pairs || []).filter(p => p.skipped);
	return el('p', { id: 'history' }, 'Failed punches in a row: ', fmtNum(h.failed_punches || 0, 0), '. ',
	          skipped.length ? 'Planned through the relay (or past the household dial) for now: ' +
	                           skipped.map(p => 'host ' + p.peer + ' (' + p.rung + ')').join(', ') + '.'
	                         : 'Every pair is tried by its usual rung.');
}

async function pageHost() {
	const id = idParam();
	const [h, net] = await Promise.all([getJSON('/credit/hosts/' + id),
	                                    getJSON('/hosts/' + id + '/network').catch(e => e)]);
	document.title = 'Host ' + h.id;
	setMain(el('h1', { id: 'name' }, 'Host ' + h.id),
	        el('div', { class: 'stats' }, stat('owner', link('/user?id=' + h.owner_id, utext(h.owner_name))),
	           stat('total credit', fmtNum(h.total_credit)), stat('pending', fmtNum(h.pending_credit)),
	           stat('recent average', fmtNum(h.expavg_credit)),
	           stat('spot checks agreed in a row', fmtNum(h.spot_checks.consecutive, 0)),
	           stat('averaging checks failed', fmtNum(h.sketch_flags.count, 0))),
	        el('div', { class: 'card' },
	           el('p', {}, 'CPU: ', utext(h.cpu_model, 256), ' (', fmtNum(h.cores, 0), ' cores)'),
	           el('p', {}, 'GPU: ', utext(h.gpu || 'none', 256)),
	           el('p', {}, 'OS: ', utext(h.os_name), ' ', utext(h.os_version)),
	           el('p', {}, 'Measured speed: ', fmtNum(h.flops / 1e9, 1), ' GFLOP/s; client ', utext(h.client_version)),
	           el('p', {}, 'Registered ', fmtTime(h.created_at), '; last seen ', fmtTime(h.last_seen))),
	        net instanceof Error ? el('p', { class: 'error' }, 'Could not load the network view: ' + net.message)
	                             : hostNetwork(net),
	        h.sketch_flags.count > 0 ? el('h2', {}, 'Averaging checks failed') : '',
	        h.sketch_flags.count > 0 ? sketchFlagsTable(h.sketch_flags.latest) : '',
	        el('h2', {}, 'Recent grants'), grantsTable(h.grants));
}

// The rounds in which the host failed a check of the averaged bytes
// against its sketches (doc/credit.md, "Tied to the bytes").
function sketchFlagsTable(flags) {
	const t = el('table', {}, el('tr', {}, el('th', {}, 'project'), el('th', {}, 'round'), el('th', {}, 'as'),
	                             el('th', {}, 'why'), el('th', {}, 'distance / tolerance'), el('th', {}, 'when')));
	for (const f of flags)
		t.append(el('tr', {}, el('td', {}, utext(f.project)), el('td', { class: 'num' }, fmtNum(f.version, 0)),
		            el('td', {}, utext(f.role)), el('td', {}, utext(f.reason, 256)),
		            el('td', { class: 'num' }, fmtNum(f.distance, 4) + ' / ' + fmtNum(f.tolerance, 4)),
		            el('td', {}, fmtTime(f.created_at))));
	return t;
}

const PAGES = { index: pageIndex, dashboard: pageDashboard, leaderboard: pageLeaderboard,
                user: pageUser, team: pageTeam, host: pageHost };

document.addEventListener('DOMContentLoaded', () => {
	const f = PAGES[document.body.dataset.page];
	if (f)
		f().catch(fail);
});
