// The history page's filter: hides the charts (and step-change rows) that do not match the chosen model, engine and batch.
// A static file (no inline script), so that it runs under a strict Content-Security-Policy.
(function () {
  "use strict";
  var form = document.getElementById("filter");
  if (!form) { return; }
  var keys = ["model", "engine", "batch"];
  var charts = Array.prototype.slice.call(document.querySelectorAll("figure.chart"));
  var rows = Array.prototype.slice.call(document.querySelectorAll("#steps tbody tr"));
  var params = new URLSearchParams(window.location.search);
  keys.forEach(function (k) { if (params.get(k)) { form.elements[k].value = params.get(k); } });

  function matches(element) {
    return keys.every(function (k) {
      var want = form.elements[k].value;
      return !want || element.dataset[k] === want;
    });
  }

  function apply() {
    var shown = 0;
    charts.forEach(function (chart) {
      chart.hidden = !matches(chart);
      if (!chart.hidden) { shown += 1; }
    });
    rows.forEach(function (row) { row.hidden = !matches(row); });
    document.querySelectorAll("section.engine, section.model").forEach(function (section) {
      section.hidden = !section.querySelector("figure.chart:not([hidden])");
    });
    document.getElementById("shown").textContent = shown + " of " + charts.length + " charts shown";
  }

  form.addEventListener("change", apply);
  form.addEventListener("submit", function (event) { event.preventDefault(); apply(); });
  apply();
}());
