// The overview refreshes itself every few seconds while its box is ticked (remembered
// in this browser): the live part of the page is fetched again and swapped in place.
(function () {
  "use strict";
  var box = document.getElementById("overview-refresh");
  var live = document.getElementById("overview-live");
  if (!box || !live) { return; }
  var key = "cleanup-overview-refresh";
  var seconds = parseInt(box.dataset.seconds, 10) || 5;
  box.checked = window.localStorage.getItem(key) !== "off";
  box.addEventListener("change", function () {
    window.localStorage.setItem(key, box.checked ? "on" : "off");
  });
  function refresh() {
    if (!box.checked || document.hidden) { return; }
    fetch(window.location.href, {credentials: "same-origin"})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html")
          .getElementById("overview-live");
        if (fresh) { live.innerHTML = fresh.innerHTML; }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, seconds * 1000);
})();
