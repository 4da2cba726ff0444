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
	requestAnimationFrame(markOverflow);
	setTimeout(markOverflow, 1000); /* again once fonts and plots settled */
}

/* Record on <html> by how many pixels the page is wider than the window
 * (data-overflow, 0 when it fits): a page must never scroll sideways, on a
 * phone least of all; wide tables scroll inside their own box.  And how
 * many time cells (.when) cut their text (data-cut-times).  The web test
 * reads both in headless Chromium at 1280 and 390 px. */
function markOverflow() {
	const d = document.documentElement;
	d.setAttribute('data-overflow', String(Math.max(0, d.scrollWidth - d.clientWidth)));
	const cut = Array.from(document.querySelectorAll('td.when, th.when')).filter(c => c.scrollWidth > c.clientWidth);
	d.setAttribute('data-cut-times', String(cut.length));
}
window.addEventListener('resize', () => requestAnimationFrame(markOverflow));

/* A table in a box of its own that scrolls sideways when the window is
 * narrower than the table needs. */
function scrollBox(table) { return el('div', { class: 'scroll' }, table); }

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
	/* opts.time: x is unix seconds, labelled as UTC times of day (with the
	 * date when the span is longer than a day) */
	const xtext = x => !opts.time ? String(x)
	        : new Date(x * 1000).toISOString().slice(x1 - x0 > 86400 ? 5 : 11, 16).replace('T', ' ');
	g.fillText(xtext(x0), L, h - 8);
	const xt1 = xtext(x1);
	g.fillText(xt1, w - R - g.measureText(xt1).width, h - 8);
	const xl = opts.time ? 'time (UTC)' : 'model version';
	g.fillText(xl, (L + w - R - g.measureText(xl).width) / 2, h - 8);
	c.setAttribute('data-x', opts.time ? 'time' : 'version');
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
		   el('p', {}, '2. ', link('/signup?project=' + encodeURIComponent(d.project), 'Create an account'),
		      '; the page then shows your account key and the command that attaches the client:'),
		   el('pre', {}, 'cotrainctl attach ' + url + '/projects/' + d.project + ' --key YOUR_ACCOUNT_KEY\n# or: echo "$PASSWORD" | cotrainctl attach ' + url + '/projects/' + d.project + ' --email you@example.org --password-stdin'),
		   el('p', {}, '3. Watch it work: ', el('code', {}, 'cotrainctl status'), '. Like BOINC, it computes also while you use the machine, at the lowest priority, so your own programs come first; to compute only while you are away: ', el('code', {}, 'cotrainctl prefs set only_when_idle=true'), '. To use less of the CPU: ', el('code', {}, 'cotrainctl prefs set cpu_time_percent=50'), '.')));
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
		/* x: the model version, or the time the round committed (opened,
		 * for one still open) */
		const byTime = param('x') === 'time';
		const X = r => byTime ? Date.parse(r.committed_at || r.opened_at) / 1000 : r.version;
		const axis = el('p', { class: 'tabs' }, 'Plot against: ');
		for (const [k, label] of [['version', 'model version'], ['time', 'time']])
			axis.appendChild(el('a', { href: '/dashboard?project=' + encodeURIComponent(name) + (k === 'time' ? '&x=time' : ''),
			                           class: (k === 'time') === byTime ? 'on' : null }, label));
		const popt = o => Object.assign({ time: byTime }, o);
		/* bits per byte with the byte tokenizer, per token with a subword one */
		const unit = d.tokenizer === 'byte' ? 'byte' : 'token';
		const arch = archOf(d.model);
		const evaldMlm = rounds.filter(r => r.heldout_mlm_loss !== null && r.heldout_mlm_loss !== undefined);
		const lastMlm = evaldMlm.length ? evaldMlm[evaldMlm.length - 1] : null;
		/* a GPT's loss in bits per byte (byte tokenizer) or token beside the
		 * held-out figure; an encoder's MLM + SOP loss in nats beside the
		 * held-out masked-LM loss (the sentence-order part is not
		 * evaluated) */
		const lossPlot = arch === GPT_ARCH
			? plot('Loss (bits per ' + unit + ')', done.filter(r => r.loss !== null && r.loss !== undefined).map(r => ({ x: X(r), y: Number(r.loss) / Math.LN2 })),
			       popt({ label: 'training', second: { label: 'held-out', color: '#c53030', points: evald.map(r => ({ x: X(r), y: Number(r.heldout_bpb) })) } }))
			: plot('Loss (' + arch.objective + ', nats)', done.filter(r => r.loss !== null && r.loss !== undefined).map(r => ({ x: X(r), y: Number(r.loss) })),
			       popt({ label: 'training', second: { label: 'held-out masked LM', color: '#c53030', points: evaldMlm.map(r => ({ x: X(r), y: Number(r.heldout_mlm_loss) })) } }));
		const heldStat = arch === GPT_ARCH
			? stat('held-out bits / ' + unit, evald.length ? fmtNum(evald[evald.length - 1].heldout_bpb, 4) + ' (v' + evald[evald.length - 1].version + ')' : '–')
			: stat('held-out MLM accuracy', lastMlm ? fmtNum(100 * lastMlm.heldout_mlm_accuracy, 1) + ' % (v' + lastMlm.version + ')' : '–');
		setMain(
			el('h1', {}, utext(d.title, 200), ' — training'),
			el('div', { class: 'stats' },
			   stat('objective', arch.objective),
			   stat('model version', fmtNum(d.current_version, 0)),
			   stat('active peers', fmtNum(d.active_hosts, 0)),
			   stat('samples / s now', fmtNum(d.samples_per_sec, 1)),
			   stat('last loss', last && last.loss !== null ? fmtNum(last.loss, 4) : '–'),
			   heldStat,
			   stat('last round', last && last.seconds ? fmtNum(last.seconds, 1) + ' s' : '–'),
			   stat('round ' + (cur ? cur.version : '–'), cur ? cur.state : '–')),
			axis,
			el('div', { class: 'plots', id: 'plots' },
			   /* a GPT's: both in bits per byte (byte tokenizer) or token,
			    * the training loss the peers reported, in nats, over ln 2,
			    * and the held-out figure of the same model version,
			    * computed by the server */
			   lossPlot,
			   plot('Samples per second (per round)', done.filter(r => r.seconds > 0).map(r => ({ x: X(r), y: r.samples / r.seconds })), popt({ zero: true, color: '#2f855a' })),
			   plot('Time per round (s)', done.filter(r => r.seconds > 0).map(r => ({ x: X(r), y: r.seconds })), popt({ zero: true, color: '#b7791f' })),
			   plot('Peers per round', done.map(r => ({ x: X(r), y: r.n_peers })), popt({ zero: true, color: '#6b46c1' }))),
			el('h2', {}, 'Contributors'),
			contributorsTable(d.contributors || []),
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

/* The dashboard's contributors, as sahajBERT's: who trained, how many
 * samples, how much credit, when last seen. */
function contributorsTable(rows) {
	if (!rows.length)
		return el('p', {}, 'No contributions yet.');
	const body = el('tbody', { id: 'contributors' });
	rows.forEach((c, i) => body.appendChild(el('tr', { class: 'contributor' }, el('td', { class: 'rank' }, i + 1),
	              el('td', {}, link('/user?id=' + c.id, utext(c.name))), el('td', { class: 'num' }, fmtNum(c.samples, 0)),
	              el('td', { class: 'num' }, fmtNum(c.credit)), el('td', { class: 'when' }, fmtTime(c.last_seen)))));
	return scrollBox(el('table', {}, el('thead', {}, el('tr', {}, el('th', { class: 'rank' }, '#'), el('th', {}, 'Name'),
	                 el('th', { class: 'num' }, 'Samples'), el('th', { class: 'num' }, 'Credit'),
	                 el('th', { class: 'when' }, 'Last seen'))), body));
}

function grantsTable(grants) {
	if (!grants.length)
		return el('p', {}, 'No grants yet.');
	const body = el('tbody', {});
	for (const g of grants)
		body.appendChild(el('tr', {}, el('td', { class: 'when' }, fmtTime(g.granted_at || g.created_at)),
		                    el('td', {}, utext(g.project)), el('td', { class: 'num' }, g.version),
		                    el('td', {}, g.kind), el('td', { class: 'num' }, fmtNum(g.samples, 0)),
		                    el('td', { class: 'num' }, fmtNum(g.credit, 4)),
		                    el('td', { title: g.reason || null }, g.status)));
	return scrollBox(el('table', {}, el('thead', {}, el('tr', {}, el('th', { class: 'when' }, 'When'), el('th', {}, 'Project'),
	          el('th', { class: 'num' }, 'Version'), el('th', {}, 'For'), el('th', { class: 'num' }, 'Samples'),
	          el('th', { class: 'num' }, 'Credit'), el('th', {}, 'Status'))), body));
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
	else
		requestAnimationFrame(markOverflow); /* a page made by the server (the sign-up form) */
});
