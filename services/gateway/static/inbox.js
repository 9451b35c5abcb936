// The inbox's live updates: the gateway's event stream (GET /v1/events, same origin, the
// session cookie) tells the page that something it shows changed; the page fetches its own
// HTML again and swaps in the part that changed. No framework, no build step. Without this
// script every page still works, only not live.
"use strict";

(function () {
  const page = document.body.dataset.page;
  const announce = (text) => {
    const region = document.getElementById("announce");
    if (region) { region.textContent = ""; setTimeout(() => { region.textContent = text; }, 50); }
  };

  // --- ages and deadlines, ticking --------------------------------------------------------
  function duration(seconds) {
    if (seconds <= 0) return "expired";
    const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = Math.floor(seconds % 60);
    const two = (n) => String(n).padStart(2, "0");
    if (h) return `${h} h ${two(m)} min`;
    if (m) return `${m} min ${two(s)} s`;
    return `${s} s`;
  }
  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll("[data-age-from]")) {
      el.textContent = duration(Math.max(0, (now - Date.parse(el.dataset.ageFrom)) / 1000)) || "0 s";
    }
    for (const el of document.querySelectorAll("[data-left-until]")) {
      if (el.dataset.leftUntil) el.textContent = duration((Date.parse(el.dataset.leftUntil) - now) / 1000);
    }
  }
  setInterval(tick, 1000);

  // --- swapping in what changed -------------------------------------------------------------
  // Fetch this page again and replace the named parts, keeping focus where it was when the
  // focused element is still there.
  async function refresh(ids) {
    const answer = await fetch(location.pathname + location.search, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (answer.redirected || !answer.ok) return null;
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    const focused = document.activeElement && document.activeElement.id;
    const swapped = {};
    for (const id of ids) {
      const now = document.getElementById(id), then = fresh.getElementById(id);
      if (now && then) { swapped[id] = { before: now, after: then }; now.replaceWith(then); }
    }
    if (focused && !document.getElementById(focused)) {
      // The focused control left with its card: put focus somewhere sensible, not on <body>.
      document.getElementById("main").focus();
    } else if (focused && document.activeElement !== document.getElementById(focused)) {
      document.getElementById(focused).focus();
    }
    tick();
    return { fresh, swapped };
  }

  let pending = null, running = false;
  function soon(work) {
    // Coalesce bursts of events (a replay, a batch) into one fetch at a time.
    pending = work;
    if (running) return;
    running = true;
    setTimeout(async () => {
      while (pending) {
        const next = pending; pending = null;
        try { await next(); } catch (e) { /* the next event tries again */ }
      }
      running = false;
    }, 150);
  }

  function cardIds() {
    return new Set(Array.from(document.querySelectorAll("#cards [data-request]")).map((el) => el.dataset.request));
  }

  async function refreshInbox() {
    const before = cardIds();
    const result = await refresh(["cards"]);
    if (!result) return;
    const after = cardIds();
    const came = [...after].filter((id) => !before.has(id)), went = [...before].filter((id) => !after.has(id));
    if (came.length) announce(`${came.length} new card${came.length > 1 ? "s" : ""} in your inbox.`);
    if (went.length) announce(`${went.length} card${went.length > 1 ? "s" : ""} left your inbox: decided, expired or cancelled.`);
  }

  async function refreshCard() {
    const result = await refresh(["card-state"]);
    if (!result) return;
    const digest = document.getElementById("digest"), edited = result.fresh.getElementById("digest");
    if (digest && edited && digest.textContent !== edited.textContent) {
      // Someone edited the arguments: what this page would approve no longer runs (its digest
      // is refused). Show the edited version: its arguments, the edit, its digest, its forms.
      for (const id of ["arguments", "digest", "decide"]) {
        const now = document.getElementById(id), then = result.fresh.getElementById(id);
        if (now && then) now.replaceWith(then);
      }
      const said = result.fresh.getElementById("edited"), mine = document.getElementById("edited");
      if (said && mine) mine.replaceWith(said);
      else if (said) document.getElementById("arguments").after(said);
      // A hint such as "you approved it" was about the version before (that approval no longer counts).
      const hint = document.getElementById("hint"), freshHint = result.fresh.getElementById("hint");
      if (hint && freshHint) hint.replaceWith(freshHint);
      else if (hint) hint.remove();
      else if (freshHint && document.getElementById("decide")) document.getElementById("decide").before(freshHint);
      announce("The arguments were edited: this card now shows the edited version, which needs your approval anew.");
    }
    const state = document.getElementById("card-state");
    const decide = document.getElementById("decide");
    if (state && decide && state.dataset.status !== "pending") {
      for (const button of decide.querySelectorAll("button")) button.disabled = true;
      const said = document.createElement("p");
      said.className = "notice";
      said.id = "closed";
      said.setAttribute("role", "status");
      said.textContent = `This card is now ${state.dataset.status}; there is nothing left to decide.`;
      decide.replaceWith(said);
      announce(said.textContent);
    }
  }

  async function refreshSession() {
    // The cancel form is left alone while the turn is open (a reason being typed stays);
    // it goes when the turn has ended, and comes when a new one opens.
    const result = await refresh(["session-live", "session-grants", "session-story"]);
    if (!result) return;
    const mine = document.getElementById("cancel-form"), theirs = result.fresh.getElementById("cancel-form");
    if (mine && !theirs) mine.remove();
    if (!mine && theirs) document.getElementById("session-story").before(theirs);
  }

  const EVENTS = ["approval.requested", "approval.counted", "approval.decided", "approval.expired",
    "approval.escalated", "tool.closed", "turn.completed", "turn.failed", "turn.cancelled",
    "step.completed", "message.rejected", "operator.alerted"];

  function listen(concerns, work) {
    if (!window.EventSource) return;
    const stream = new EventSource("/v1/events", { withCredentials: true });
    const onEvent = (event) => {
      let data = {};
      try { data = JSON.parse(event.data); } catch (e) { return; }
      if (concerns(event.type, data)) soon(work);
    };
    for (const type of EVENTS) stream.addEventListener(type, onEvent);
    stream.addEventListener("open", () => { document.body.dataset.live = "on"; });
    stream.addEventListener("error", () => { document.body.dataset.live = "reconnecting"; });
  }

  if (page === "inbox") {
    listen((type) => type.startsWith("approval.") || type === "turn.cancelled", refreshInbox);
  } else if (page === "card") {
    const request = document.body.dataset.request;
    listen((type, data) => data.request_id === request || type === "turn.cancelled" && data.session_id === document.body.dataset.session, refreshCard);
  } else if (page === "session") {
    const session = document.body.dataset.session;
    listen((type, data) => data.session_id === session, refreshSession);
  }
  tick();
})();
