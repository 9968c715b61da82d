// delegate dashboard: live updates over server-sent events. The server
// sends the changed part of the page already rendered and escaped; log
// output arrives as text and is added as text, never as markup.
'use strict';

(function () {
  // Times are written in UTC by the server; show them in the reader's zone.
  function localize(root) {
    root.querySelectorAll('time[datetime]').forEach(function (el) {
      var d = new Date(el.getAttribute('datetime'));
      if (isNaN(d)) { return; }
      el.title = d.toString();
    });
  }
  localize(document);

  var live = document.getElementById('live');
  var state = document.getElementById('live-state');
  if (!live || !live.dataset.live || !window.EventSource) { return; }

  function show(text, cls) {
    state.hidden = false;
    state.textContent = text;
    state.className = 'live-state ' + cls;
  }

  // The page keeps at most this much of a live log (the download has all).
  var maxLog = 512 * 1024;
  var events = new EventSource(live.dataset.live);
  events.addEventListener('open', function () { show('live', 'on'); });
  events.addEventListener('error', function () {
    show(events.readyState === EventSource.CLOSED ? 'not updating: reload the page' : 'reconnecting…', 'off');
  });
  events.addEventListener('html', function (e) {
    var log = document.getElementById('log');
    // A question's form being filled in is kept as it is (and the field
    // being typed in keeps the focus), not replaced by a new, empty one.
    var forms = {};
    live.querySelectorAll('form[data-question]').forEach(function (f) { forms[f.dataset.question] = f; });
    var focused = document.activeElement;
    // A confirmation the reader has opened stays open (by its id).
    var open = Array.prototype.map.call(live.querySelectorAll('details[id][open]'), function (el) { return el.id; });
    live.innerHTML = JSON.parse(e.data).html;
    open.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.open = true; }
    });
    // Keep the log followed so far in place of the new, empty one.
    var slot = document.getElementById('log');
    if (log && slot) { slot.replaceWith(log); }
    live.querySelectorAll('form[data-question]').forEach(function (f) {
      var kept = forms[f.dataset.question];
      if (kept) { f.replaceWith(kept); }
    });
    if (focused && live.contains(focused)) { focused.focus(); }
    localize(live);
  });
  events.addEventListener('log', function (e) {
    var log = document.getElementById('log');
    if (!log) { return; }
    var atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    log.append(JSON.parse(e.data).text);
    if (log.textContent.length > maxLog) {
      log.textContent = log.textContent.slice(-maxLog);
    }
    if (atEnd) { log.scrollTop = log.scrollHeight; }
  });
  events.addEventListener('end', function () {
    events.close();
    show('finished', 'on');
  });
})();
