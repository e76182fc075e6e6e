// Click a header of any table.sortable to sort by that column; click again to reverse.
// Cells may carry data-sort (a number or text) when what they show is not what should sort.
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
  function sortBy(th) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var ascending = th.getAttribute("aria-sort") !== "ascending";
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
  // "#sort=score,score" clicks those headers in turn, so a link can open the page sorted.
  var match = /^#sort=([\w,-]+)$/.exec(location.hash);
  if (match) {
    match[1].split(",").forEach(function (col) {
      var th = document.querySelector('th[data-col="' + col + '"]');
      if (th) th.click();
    });
  }
  document.documentElement.setAttribute("data-sort-ready", "yes");
})();
