// trueup dashboard: live fleet, device and rollout updates over server-sent events. No framework, no build.
"use strict";
(function () {
  const live = document.getElementById("live");

  function connected() {
    if (live) {
      live.textContent = "live · updated " + new Date().toISOString().replace(/\.\d+Z$/, "Z");
      live.className = "live on";
    }
  }

  function follow(url, name, apply) {
    const source = new EventSource(url);
    source.addEventListener(name, function (event) {
      apply(JSON.parse(event.data));
      connected();
    });
    source.addEventListener("logout", function () {
      source.close();
      window.location.assign("/ui/login");
    });
    source.addEventListener("gone", function () {
      source.close();
      if (live) {
        live.textContent = "this device is gone";
        live.className = "live off";
      }
    });
    source.onerror = function () {
      if (live) {
        live.textContent = "reconnecting…";
        live.className = "live off";
      }
    };
  }

  const body = document.getElementById("fleet-body");
  const device = document.getElementById("device-live");
  const rollout = document.getElementById("rollout-live");
  if ((!body && !device && !rollout) || !window.EventSource) {
    if (live) live.textContent = "not live (reload to refresh)";
    return;
  }
  if (body) {
    follow(body.dataset.stream, "fleet", function (update) {
      body.innerHTML = update.rows;
      for (const chip of document.querySelectorAll("[data-count]")) {
        const count = chip.querySelector("b");
        if (count) count.textContent = String(update.counts[chip.dataset.count] || 0);
      }
      const matched = document.getElementById("fleet-matched");
      if (matched) matched.textContent = String(update.matched);
    });
  }
  function replaceParts(parts) {
    for (const id of Object.keys(parts)) {
      const part = document.getElementById(id);
      if (part) part.innerHTML = parts[id];
    }
  }
  if (device) {
    // The device page's parts that follow the device; the forms are left as they are.
    follow(device.dataset.stream, "device", replaceParts);
  }
  if (rollout) {
    // A rollout's state, waves, devices and the actions its state allows.
    follow(rollout.dataset.stream, "rollout", replaceParts);
  }
})();
