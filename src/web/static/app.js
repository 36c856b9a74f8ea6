// slotpool web: keeps the overview live without reloading. Every value is set as
// text (textContent), never as HTML: names and event fields are hostile input.
(function () {
  'use strict';
  var body = document.body;
  if (body.dataset.page !== 'overview') return;
  var every = Math.max(200, Number(body.dataset.refreshMs) || 1000);

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function age(ms) {
    if (ms === null || ms === undefined) return '-';
    if (ms < 1000) return Math.max(0, ms) + 'ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + 's';
    return Math.floor(ms / 60000) + 'm' + String(Math.floor(ms / 1000) % 60).padStart(2, '0') + 's';
  }

  function item(id, text, cls) {
    var li = el('li', cls, text);
    li.id = id;
    return li;
  }

  function renderSummary(d) {
    var s = d.summary;
    var robots = d.robots_at_ms === null ? 'robots: reading…' : s.robots + ' robots';
    if (d.robots_at_ms !== null) {
      Object.keys(s.robots_by_state).forEach(function (k) { robots += ' · ' + s.robots_by_state[k] + ' ' + k; });
    }
    var items = [
      item('sum-slots', s.held + ' of ' + s.slots + ' slots held'),
      item('sum-unheld', s.unheld + ' waiting for a worker', s.unheld > 0 ? 'bad' : 'good'),
      item('sum-workers', s.workers + ' workers, ' + s.standbys + ' standby'),
      item('sum-absorb', 'can absorb ' + s.failures_absorbable + ' holder failure(s)', s.failures_absorbable === 0 ? 'bad' : 'good'),
      item('sum-robots', robots)
    ];
    if (s.robots_unplaced > 0) {
      items.push(el('li', 'bad', s.robots_unplaced + ' robots bound to no existing slot (see slotpool robot list)'));
    }
    document.getElementById('summary').replaceChildren.apply(document.getElementById('summary'), items);
  }

  function renderSlots(slots) {
    var tbody = document.querySelector('#slots tbody');
    var rows = new Map();
    tbody.querySelectorAll('tr[data-slot]').forEach(function (tr) { rows.set(tr.dataset.slot, tr); });
    slots.forEach(function (s) {
      var tr = rows.get(s.id);
      if (!tr) {
        tr = el('tr');
        tr.dataset.slot = s.id;
        ['slot', 'state', 'holder', 'lease', 'epoch', 'robots', 'cpu', 'actions'].forEach(function (c) { tr.appendChild(el('td', c)); });
        tr.querySelector('.slot').textContent = s.id;
        var m = el('meter');
        m.min = 0;
        tr.querySelector('.lease').append(m, ' ', el('span', 'left'));
      }
      rows.delete(s.id);
      tbody.appendChild(tr);
      tr.querySelector('.state').replaceChildren(el('span', 'badge ' + s.state, s.state));
      tr.querySelector('.holder').textContent = s.holder || '-';
      var meter = tr.querySelector('meter');
      meter.max = s.lease_ms || 1;
      meter.value = s.lease_left_ms || 0;
      tr.querySelector('.left').textContent = s.lease_left_ms === null ? '-' : s.lease_left_ms + ' ms';
      tr.querySelector('.epoch').textContent = s.epoch === null ? '-' : s.epoch;
      tr.querySelector('.robots').textContent = s.robots;
      var cpu = tr.querySelector('.cpu');
      cpu.textContent = s.cost ? (s.cost.total.millicores / 1000).toFixed(2) : '-';
      cpu.title = s.cost && s.cost.top.length
        ? 'heaviest: ' + s.cost.top.map(function (r) { return r.name + ' ' + (r.millicores / 1000).toFixed(2) + ' cores'; }).join(', ')
        : 'no measured robot';
      var form = tr.querySelector('.actions form');
      if (form) {
        form.action = '/slots/' + encodeURIComponent(s.id) + '/' + (s.draining ? 'undrain' : 'drain');
        form.querySelector('button').textContent = s.draining ? 'Undrain' : 'Drain';
      }
    });
    rows.forEach(function (tr) { tr.remove(); });
  }

  function renderWorkers(workers) {
    var rows = workers.map(function (w) {
      var tr = el('tr');
      var load = w.load ? w.load.score.toFixed(1) : '-';
      [w.id, w.role, w.slot || '-', w.held || 0, load, age(w.last_seen_ms) + ' ago', w.version || '-'].forEach(function (t) { tr.appendChild(el('td', null, t)); });
      if (w.load) {
        tr.children[4].title = 'CPU ' + Math.round(w.load.cpu * 100) + '% of ' + w.load.cores.toFixed(2) + ' cores, executors ' +
          w.load.robots + ' of ' + w.load.capacity + ', memory ' + Math.round(w.load.memory * 100) + '%';
      }
      return tr;
    });
    var tbody = document.querySelector('#workers tbody');
    tbody.replaceChildren.apply(tbody, rows);
  }

  function renderEvents(events) {
    var items = events.map(function (e) {
      var li = el('li');
      li.append(el('span', 'at', e.at || '?'), ' ', el('span', 'kind', e.kind), ' ');
      Object.keys(e.fields).forEach(function (k) { li.append(el('span', 'field', k + '=' + e.fields[k]), ' '); });
      return li;
    });
    var list = document.getElementById('events');
    list.replaceChildren.apply(list, items);
  }

  function fresh(text, bad) {
    var p = document.getElementById('freshness');
    p.replaceChildren(el('span', bad ? 'error' : null, text));
  }

  function tick() {
    fetch('/api/v1/overview', { cache: 'no-store', credentials: 'same-origin' })
      .then(function (r) {
        if (!r.ok) throw new Error('the dashboard answered ' + r.status);
        return r.json();
      })
      .then(function (d) {
        renderSummary(d);
        renderSlots(d.slots);
        renderWorkers(d.workers);
        renderEvents(d.events);
        if (d.error) fresh('The last refresh failed: ' + d.error, true);
        else fresh('Live: updated ' + new Date().toLocaleTimeString() + ', on the database server\'s clock.');
      })
      .catch(function (e) { fresh('Not updating: ' + e.message, true); })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
