// Tether's status page: live updates over Server-Sent Events (SPEC §18).
// The page is complete without this script; it only follows the streams.
// Every value from a stream is set as text (textContent), never as HTML.
'use strict';
(function () {
  const page = document.body.dataset.page;
  const live = document.getElementById('live');
  const runEl = document.getElementById('run');
  let url = null;
  if (page === 'run' && runEl) {
    url = '/api/runs/' + encodeURIComponent(runEl.dataset.run) + '/events';
  } else if (page === 'runs' || page === 'events' || page === 'workers') {
    url = '/api/events';
  }
  if (!url || !window.EventSource) return;

  function matching(attr, value) {
    return Array.from(document.querySelectorAll('[' + attr + ']')).filter(function (e) {
      return e.getAttribute(attr) === value;
    });
  }
  function stepID(d) {
    return d.step.indexOf('/') >= 0 ? d.step : d.run + '/' + d.step;
  }
  function when(t) {
    if (!t) return '';
    const d = new Date(t);
    if (isNaN(d.getTime()) || d.getTime() <= 0) return '';
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }
  function took(a, b) {
    const ms = new Date(b).getTime() - new Date(a).getTime();
    if (isNaN(ms) || ms < 0) return '';
    return ms < 1000 ? ms + 'ms' : (ms / 1000).toFixed(3).replace(/\.?0+$/, '') + 's';
  }
  // workerName is the name of a worker instance the page was rendered
  // with, else its id.
  function workerName(id) {
    const li = matching('data-id', id).find(function (e) { return e.tagName === 'LI'; });
    return li ? li.textContent : id;
  }
  function setClass(el, prefix, value) {
    Array.from(el.classList).forEach(function (c) {
      if (c.indexOf(prefix) === 0) el.classList.remove(c);
    });
    el.classList.add(prefix + value);
  }
  function field(root, name, text) {
    root.querySelectorAll('[data-field="' + name + '"]').forEach(function (f) { f.textContent = text; });
  }
  function stepName(id) {
    const row = matching('data-step', id).find(function (e) { return e.tagName === 'TR'; });
    const cell = row && row.querySelector('.step-name');
    return cell ? cell.textContent : id.slice(id.indexOf('/') + 1);
  }
  function parse(ev) {
    try { return JSON.parse(ev.data); } catch (e) { return null; }
  }

  function onStep(d) {
    matching('data-step', stepID(d)).forEach(function (el) {
      el.dataset.state = d.state;
      if (el.classList.contains('node')) setClass(el, 's-', d.state);
      el.querySelectorAll('.badge[data-field="state"]').forEach(function (b) { setClass(b, 's-', d.state); });
      field(el, 'state', d.state);
      if (d.attempts !== undefined) field(el, 'attempts', String(d.attempts));
      // The stream names a worker by its instance id; the page shows its
      // name, which stays while the instance is the same.
      el.querySelectorAll('.worker').forEach(function (c) {
        if (d.worker && c.dataset.workerId !== d.worker) {
          c.dataset.workerId = d.worker;
          c.textContent = workerName(d.worker);
        }
      });
      if (d.started_at && d.finished_at) field(el, 'took', took(d.started_at, d.finished_at));
      if (d.exit !== undefined && d.exit !== null) field(el, 'exit', String(d.exit));
      if (d.started_at) field(el, 'started', when(d.started_at));
      if (d.finished_at) field(el, 'finished', when(d.finished_at));
      const gate = el.querySelector('.gate');
      if (gate) gate.hidden = d.state !== 'held';
    });
  }
  function onRun(d) {
    const st = document.getElementById('run-status');
    if (st && runEl && runEl.dataset.run === d.run) {
      st.textContent = d.status;
      setClass(st, 's-', d.status);
      if (d.finished) {
        const f = document.getElementById('cancel-form');
        if (f) f.remove();
      }
    }
    matching('data-run', d.run).forEach(function (row) {
      if (row.tagName !== 'TR') return;
      row.querySelectorAll('td:nth-child(3) .badge').forEach(function (b) {
        b.textContent = d.status;
        setClass(b, 's-', d.status);
      });
    });
  }
  // shown says whether the page already holds the element of this key
  // (a stream may start by sending what the page was rendered with, every
  // line of a long log): the keys of a container are read from the page
  // once, then kept as elements are added (mark), so each check is one
  // lookup, not a walk of every line.
  const keySets = new WeakMap();
  function keysOf(root) {
    let set = keySets.get(root);
    if (!set) {
      set = new Set();
      root.querySelectorAll('[data-key]').forEach(function (e) { set.add(e.dataset.key); });
      keySets.set(root, set);
    }
    return set;
  }
  function shown(root, key) {
    return keysOf(root).has(key);
  }
  function mark(root, el, key) {
    el.dataset.key = key;
    keysOf(root).add(key);
  }
  function logLine(d, text, cls) {
    const log = document.getElementById('log');
    if (!log) return;
    const key = d.lease + '.' + d.index;
    if (d.index !== undefined && shown(log, key)) return;
    const empty = document.getElementById('log-empty');
    if (empty) empty.remove();
    const line = document.createElement('div');
    line.className = 'line' + (cls ? ' ' + cls : '');
    if (d.index !== undefined) mark(log, line, key);
    const s = document.createElement('span');
    s.className = 'step';
    s.textContent = stepName(stepID(d));
    const t = document.createElement('span');
    t.className = 'text';
    t.textContent = text;
    line.append(s, ' ', t);
    log.append(line);
  }
  function cells(row, values) {
    values.forEach(function (v) {
      const td = document.createElement('td');
      td.textContent = v;
      row.append(td);
    });
  }
  function onServer(d) {
    if (page === 'run') {
      const body = document.querySelector('#events tbody');
      if (!body || shown(body, String(d.seq))) return;
      const row = document.createElement('tr');
      mark(body, row, String(d.seq));
      cells(row, [String(d.seq), when(d.at), d.step ? stepName(stepID(d)) : '', d.kind, d.message]);
      body.append(row);
    } else if (page === 'events') {
      const body = document.querySelector('#server-events tbody');
      if (!body || shown(body, d.run + '#' + d.seq)) return;
      body.querySelectorAll('tr.none').forEach(function (r) { r.remove(); });
      const row = document.createElement('tr');
      mark(body, row, d.run + '#' + d.seq);
      cells(row, [when(d.at), d.run, String(d.seq), d.step || '', d.kind, d.message]);
      body.prepend(row);
    }
  }
  function onWorker(d) {
    // By its id only: a worker's name may be another's id.
    matching('data-worker', d.worker).forEach(function (row) {
      row.querySelectorAll('.badge[data-field="state"]').forEach(function (b) { setClass(b, 'w-', d.state); });
      field(row, 'state', d.state);
      if (d.slots !== undefined) field(row, 'slots', String(d.slots));
      if (d.leases !== undefined) field(row, 'leases', String(d.leases));
    });
  }

  const es = new EventSource(url);
  es.onopen = function () { if (live) live.classList.add('on'); };
  es.onerror = function () { if (live) live.classList.remove('on'); };
  function on(kind, f) {
    es.addEventListener(kind, function (ev) {
      const d = parse(ev);
      if (d) f(d);
    });
  }
  on('step', onStep);
  on('run', onRun);
  on('server', onServer);
  on('worker', onWorker);
  on('log', function (d) { logLine(d, d.text, d.event ? 'event' : ''); });
  on('gap', function (d) { logLine(d, d.text || '[lines missed here]', 'gap'); });
  es.addEventListener('end', function () {
    es.close();
    if (live) live.classList.remove('on');
  });
})();
