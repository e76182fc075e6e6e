// Click a header of any table.sortable to sort by that column; click again to reverse.
// Cells may carry data-sort (a number or text) when what they show is not what should sort.
// The class table (#class-table) also has filters (#class-filters); see below.
(function () {
  "use strict";
  function sortValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    raw = raw.trim();
    var number = Number(raw);
    return raw !== "" && isFinite(number) ? number : raw.toLowerCase();
  }
  function compare(a, b) {
    var an = typeof a === "number", bn = typeof b === "number";
    if (an && bn) return a - b;
    if (an !== bn) return an ? -1 : 1;  // numbers before text, whichever way we sort
    return a.localeCompare(b, undefined, {numeric: true});
  }
  // ascending: true or false to force a direction; left out, a click's toggle.
  function sortBy(th, ascending) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    if (ascending === undefined) ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th[aria-sort]").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows).map(function (row, i) {
      return {row: row, key: sortValue(row, index), i: i};
    });
    rows.sort(function (a, b) {
      var c = compare(a.key, b.key);
      return (ascending ? c : -c) || a.i - b.i;  // stable: ties keep their current order
    });
    rows.forEach(function (r) { body.appendChild(r.row); });
  }
  document.querySelectorAll("table.sortable th").forEach(function (th) {
    th.tabIndex = 0;
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });

  // The class table's filters. Rows are hidden, never removed, so sorting moves hidden rows too
  // and clearing a filter brings them back in the current order. The controls come with the
  // hidden attribute: with JavaScript off there is nothing to click and every row shows.
  var table = document.getElementById("class-table");
  var filters = document.getElementById("class-filters");
  var failing = document.getElementById("filter-failing");
  var partSelect = document.getElementById("filter-part");
  var count = document.getElementById("filter-count");
  // The cell of `row` (or header row) for part `key`, compared as text: keys come from
  // results.json and are never put into a CSS selector.
  function partCell(row, key) {
    for (var i = 0; i < row.cells.length; i++) {
      if (row.cells[i].getAttribute("data-part") === key) return row.cells[i];
    }
    return null;
  }
  function applyFilters() {
    var part = partSelect.value;  // "" = every part
    table.querySelectorAll("[data-part]").forEach(function (cell) {
      cell.hidden = part !== "" && cell.getAttribute("data-part") !== part;
    });
    var rows = Array.prototype.filter.call(table.tBodies[0].rows, function (row) {
      return row.hasAttribute("data-name");  // not the "no results" placeholder row
    });
    var shown = 0;
    rows.forEach(function (row) {
      // "Below full marks" is the total's, or with one part shown, that part's; a total that is
      // not final (incomplete, ungradable) always shows: it needs a regrade whatever its score.
      var judged = part === "" ? row : partCell(row, part);
      var below = judged !== null && judged.getAttribute("data-below") === "yes";
      var show = !failing.checked || below || row.getAttribute("data-final") === "no";
      row.hidden = !show;
      if (show) shown += 1;
    });
    count.textContent = "showing " + shown + " of " + rows.length;
  }
  if (table && filters && failing && partSelect && count) {
    failing.addEventListener("change", applyFilters);
    partSelect.addEventListener("change", function () {
      applyFilters();
      // One part chosen: its worst submissions first, which is what one reads a part's column for.
      var th = partSelect.value === "" ? null : partCell(table.tHead.rows[0], partSelect.value);
      if (th) sortBy(th, true);
    });
    filters.hidden = false;
    applyFilters();
  }

  // The address can set the page up, so a link can open it sorted or filtered: "#sort=score,score"
  // clicks those headers in turn, "#only=failing" ticks the failing filter, "#part=ddp" shows one
  // part; joined with "&", in the order given. Each goes through the control a person would use.
  location.hash.replace(/^#/, "").split("&").forEach(function (setting) {
    var match = /^(sort|only|part)=([\w,-]+)$/.exec(setting);
    if (!match) return;
    if (match[1] === "sort") {
      match[2].split(",").forEach(function (col) {
        var th = document.querySelector('th[data-col="' + col + '"]');  // \w and - only: safe here
        if (th) th.click();
      });
    } else if (match[1] === "only" && match[2] === "failing" && failing) {
      failing.checked = true;
      failing.dispatchEvent(new Event("change"));
    } else if (match[1] === "part" && partSelect) {
      partSelect.value = match[2];
      partSelect.dispatchEvent(new Event("change"));
    }
  });
  document.documentElement.setAttribute("data-sort-ready", "yes");
})();
