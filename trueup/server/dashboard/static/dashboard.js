// trueup dashboard: live fleet updates over server-sent events. No framework, no build.
"use strict";
(function () {
  const body = document.getElementById("fleet-body");
  const live = document.getElementById("live");
  if (!body || !window.EventSource) {
    if (live) live.textContent = "not live (reload to refresh)";
    return;
  }
  const source = new EventSource(body.dataset.stream);
  source.addEventListener("fleet", function (event) {
    const update = JSON.parse(event.data);
    body.innerHTML = update.rows;
    for (const chip of document.querySelectorAll("[data-count]")) {
      const count = chip.querySelector("b");
      if (count) count.textContent = String(update.counts[chip.dataset.count] || 0);
    }
    const matched = document.getElementById("fleet-matched");
    if (matched) matched.textContent = String(update.matched);
    if (live) {
      live.textContent = "live · updated " + new Date().toISOString().replace(/\.\d+Z$/, "Z");
      live.className = "live on";
    }
  });
  source.addEventListener("logout", function () {
    source.close();
    window.location.assign("/ui/login");
  });
  source.onerror = function () {
    if (live) {
      live.textContent = "reconnecting…";
      live.className = "live off";
    }
  };
})();
