// Draws the figures from the embedded JSON and wires the copy buttons. No network, no libraries.
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("memdoc-figures").textContent);
  var config = {
    responsive: true,
    displaylogo: false,
    showLink: false,
    showSendToCloud: false,
    showEditInChartStudio: false,
    modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"],
    toImageButtonOptions: { format: "png", scale: 2 }
  };
  Object.keys(figures).forEach(function (id) {
    var el = document.getElementById(id);
    if (el && window.Plotly) {
      window.Plotly.newPlot(el, figures[id].data, figures[id].layout, config);
    }
  });

  function copied(button, ok) {
    button.textContent = ok ? "Copied" : "Select and copy";
    button.classList.toggle("done", ok);
    window.setTimeout(function () { button.textContent = "Copy"; button.classList.remove("done"); }, 1600);
  }

  function fallbackCopy(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    return ok;
  }

  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () {
      var code = button.closest(".fix").querySelector("code").textContent;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(code).then(
          function () { copied(button, true); },
          function () { copied(button, fallbackCopy(code)); }
        );
      } else {
        copied(button, fallbackCopy(code));
      }
    });
  });
})();
