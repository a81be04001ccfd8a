// Stencil pages: autosave, span selection, live progress, double-submit guard. No dependencies.
(function () {
  "use strict";

  function csrfToken() {
    var input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function sendJson(method, url, body) {
    return fetch(url, {
      method: method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken(), "Accept": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  }

  // -- autosave of the form values (PATCH /api/v1/drafts/<id>) ------------------------------
  function setupAutosave(form) {
    var url = form.dataset.autosaveUrl;
    var status = document.getElementById("autosave-status");
    var timer = null;
    var inflight = false;
    var again = false;

    function values() {
      var out = {};
      form.querySelectorAll("input[name], textarea[name], select[name]").forEach(function (el) {
        if (el.name !== "csrfmiddlewaretoken" && el.type !== "hidden") { out[el.name] = el.value; }
      });
      return out;
    }

    function showErrors(errors) {
      form.querySelectorAll("[data-error-for]").forEach(function (p) {
        var name = p.dataset.errorFor;
        var message = errors[name] || "";
        p.textContent = message;
        var input = form.querySelector("[name='" + name + "']");
        if (input) {
          if (message) { input.setAttribute("aria-invalid", "true"); } else { input.removeAttribute("aria-invalid"); }
          input.closest(".field").classList.toggle("invalid", !!message);
        }
      });
    }

    function save() {
      if (inflight) { again = true; return; }
      inflight = true;
      status.textContent = "Saving…";
      sendJson("PATCH", url, { values: values() }).then(function (response) {
        return response.json().then(function (data) { return { ok: response.ok, data: data }; });
      }).then(function (answer) {
        if (answer.ok) {
          showErrors({});
          status.textContent = "Saved at " + new Date().toLocaleTimeString() + ".";
        } else {
          showErrors(answer.data.errors || {});
          status.textContent = "Not saved: " + (answer.data.error || "please check the fields") + " Your typing is kept here.";
        }
      }).catch(function () {
        status.textContent = "Not saved: the server could not be reached. Your typing is kept here.";
      }).finally(function () {
        inflight = false;
        if (again) { again = false; save(); }
      });
    }

    form.addEventListener("input", function () {
      clearTimeout(timer);
      status.textContent = "Unsaved changes…";
      timer = setTimeout(save, 700);
    });
  }

  // -- selecting a span of the document to regenerate -----------------------------------------
  function codePoints(text) { return Array.from(text).length; }

  function setupSelection(doc) {
    var form = document.getElementById("selection-form");
    if (!form) { return; }
    var button = document.getElementById("sel-submit");
    var status = document.getElementById("sel-status");
    var idle = status.textContent;
    var current = null;

    function fragmentOf(node) {
      var el = node && (node.nodeType === 3 ? node.parentElement : node);
      return el ? el.closest(".document .frag") : null;
    }

    function update() {
      var sel = window.getSelection();
      var frag = null, start = 0, end = 0;
      if (sel && sel.rangeCount && !sel.isCollapsed) {
        var range = sel.getRangeAt(0);
        var a = fragmentOf(range.startContainer), b = fragmentOf(range.endContainer);
        if (a && a === b && !a.dataset.empty && a.closest(".document[data-selectable=true]")) {
          var text = a.textContent;
          var s = range.startContainer.nodeType === 3 ? range.startOffset : 0;
          var e = range.endContainer.nodeType === 3 ? range.endOffset : text.length;
          start = codePoints(text.slice(0, s));
          end = codePoints(text.slice(0, e));
          if (end > start) { frag = a; }
        } else if (a || b) {
          status.textContent = "Select text inside one fragment (a selection cannot cross fragments).";
        }
      }
      if (current && current !== frag) { current.classList.remove("selected"); }
      current = frag;
      if (frag) {
        frag.classList.add("selected");
        form.querySelector("#sel-fragment").value = frag.dataset.fragment;
        form.querySelector("#sel-start").value = start;
        form.querySelector("#sel-end").value = end;
        button.disabled = false;
        status.textContent = "Selected " + (end - start) + " characters. The model will rewrite only these.";
      } else {
        button.disabled = true;
        if (!(sel && !sel.isCollapsed)) { status.textContent = idle; }
      }
    }

    document.addEventListener("selectionchange", update);
    form.addEventListener("submit", function () {
      var preset = document.getElementById("preset");
      if (preset) { form.querySelector("input[name=preset]").value = preset.value; }
    });
  }

  // -- live progress (polls GET /api/v1/jobs/<id> every 500 ms) -------------------------------
  var STATE_TEXT = {
    queued: "Waiting in the queue.", running: "The model is writing.", validating: "Checking the result.",
    succeeded: "Done: the text is ready for review.", failed: "The infill failed.", cancelled: "Cancelled.",
  };
  var POLL_MS = 500;

  function setText(id, text) {
    var el = document.getElementById(id);
    if (el && el.textContent !== text) { el.textContent = text; }
  }

  function renderHoles(container, holes, labels, key, cls) {
    Object.keys(holes).forEach(function (name) {
      var box = container.querySelector("[data-hole='" + CSS.escape(name) + "']");
      if (!box) {
        box = document.createElement("div");
        box.className = "hole";
        box.dataset.hole = name;
        var h = document.createElement("h3");
        h.textContent = labels[name] || name;
        var p = document.createElement("p");
        p.className = cls;
        box.appendChild(h);
        box.appendChild(p);
        container.appendChild(box);
      }
      var para = box.querySelector("p");
      var text = holes[name][key] || "";
      // Only touch the DOM when the text changed, so screen readers hear each addition once.
      if (para.textContent !== text) { para.textContent = text; }
    });
  }

  function setupProgress(section) {
    var url = section.dataset.jobUrl;
    var finalStates = ["succeeded", "failed", "cancelled"];

    function render(job) {
      section.dataset.state = job.state;
      var badge = document.getElementById("job-state");
      badge.textContent = job.state;
      badge.className = "badge state-" + job.state;
      setText("state-text", STATE_TEXT[job.state] + (job.cancel_requested && !job.final ? " Cancelling…" : ""));
      setText("queue-position", job.state === "queued" ? String(job.queue_position + 1) : "—");
      var p = job.progress;
      setText("step", p.step_text);
      setText("committed", Math.round(p.committed_share * 100) + "%");
      document.getElementById("committed-bar").value = p.committed_share;
      renderHoles(document.getElementById("stable"), p.holes, job.hole_labels, "stable", "stable-text");
      var empty = document.getElementById("stable-empty");
      if (empty && Object.keys(p.holes).length) { empty.remove(); }
      renderHoles(document.getElementById("provisional-holes"), p.holes, job.hole_labels, "provisional", "provisional-text");
      if (job.reasons && job.reasons.length && job.state !== "succeeded") {
        var list = document.getElementById("reason-list");
        list.innerHTML = "";
        job.reasons.forEach(function (r) { var li = document.createElement("li"); li.textContent = r; list.appendChild(li); });
        setText("reasons-heading", job.state === "cancelled" ? "Why it was cancelled:" : "Why it failed:");
        var box = document.getElementById("reasons");
        box.classList.toggle("failed", job.state !== "cancelled");
        box.hidden = false;
      }
      if (job.final) {
        document.getElementById("cancel-form").hidden = true;
        document.getElementById("provisional").hidden = job.state === "succeeded";
        // What the model said about its own text: a guess needs a person; an unfamiliar template.
        var result = job.result || {};
        var needs = document.getElementById("needs-person");
        if (needs) { needs.hidden = result.needs_person !== true; }
        var domain = document.getElementById("domain-warning");
        if (domain) { domain.hidden = !(result.domain && result.domain.unfamiliar === true); }
        // Which model version wrote it, and the config that ran.
        var writer = document.getElementById("written-by");
        if (writer) { writer.textContent = job.written_by || ""; writer.hidden = !job.written_by; }
        if (job.config_note) { setText("config-note", job.config_note); }
        if (job.state === "succeeded") {
          var link = document.getElementById("review-link");
          if (link && job.urls.review) { link.hidden = false; }
          if (!job.draft && job.result) {
            var resultBox = document.getElementById("result");
            resultBox.innerHTML = "";
            var h = document.createElement("h2");
            h.innerHTML = 'Result <span class="badge provisional">provisional</span>';
            var pre = document.createElement("pre");
            pre.className = "final";
            pre.textContent = job.result.document;
            resultBox.appendChild(h);
            resultBox.appendChild(pre);
            resultBox.hidden = false;
          }
        }
      }
    }

    function poll() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (job) {
          render(job);
          if (!job.final) { setTimeout(poll, POLL_MS); }
        })
        .catch(function () { setTimeout(poll, POLL_MS * 4); });
    }

    if (finalStates.indexOf(section.dataset.state) === -1) { setTimeout(poll, POLL_MS); }
  }

  // -- a form that must not be sent twice (the server's compare-and-set is the real guard) ----
  function setupOnce(form) {
    form.setAttribute("data-once-ready", "");
    form.addEventListener("submit", function () {
      form.querySelectorAll("button[type=submit]").forEach(function (b) {
        setTimeout(function () { b.disabled = true; }, 0);
      });
    });
  }

  // -- choosing words to rewrite from the keyboard (a read-only text box keeps a selection) -----
  function setupPartSelection() {
    function sync(event) {
      var box = event.target;
      if (!(box instanceof HTMLTextAreaElement) || !box.hasAttribute("data-part-source")) { return; }
      var form = box.form;
      var text = box.value;
      var s = box.selectionStart, e = box.selectionEnd;
      if (e <= s) { return; }
      form.querySelector("[data-part=start]").value = codePoints(text.slice(0, s));
      form.querySelector("[data-part=end]").value = codePoints(text.slice(0, e));
      form.querySelector("[data-part=phrase]").value = text.slice(s, e);
    }
    ["select", "keyup", "mouseup"].forEach(function (name) { document.addEventListener(name, sync); });
    document.addEventListener("input", function (event) {
      var input = event.target;
      // The text to select from is not for typing in (a readonly box keeps no caret in every
      // browser): an edit is undone at once.
      if (input instanceof HTMLTextAreaElement && input.hasAttribute("data-part-source")) {
        input.value = input.defaultValue;
        return;
      }
      if (input instanceof HTMLInputElement && input.dataset.part === "phrase") {
        input.form.querySelector("[data-part=start]").value = "";  // typed words: the server finds them
        input.form.querySelector("[data-part=end]").value = "";
      }
    });
  }

  // -- the template editor's live preview (POST the source; the server renders the preview) ----
  function setupEditor(form) {
    var url = form.dataset.previewUrl;
    var status = document.getElementById("preview-status");
    var timer = null;
    function refresh() {
      var body = new FormData();
      body.append("source", form.querySelector("[name=source]").value);
      body.append("doc_format", form.querySelector("[name=doc_format]").value);
      body.append("csrfmiddlewaretoken", csrfToken());
      fetch(url, { method: "POST", body: body, credentials: "same-origin" })
        .then(function (r) { return r.text().then(function (html) { return { ok: r.ok, html: html }; }); })
        .then(function (answer) {
          swapRegions(answer.html);
          var source = form.querySelector("[name=source]");
          if (answer.ok) { source.removeAttribute("aria-invalid"); } else { source.setAttribute("aria-invalid", "true"); }
          status.textContent = answer.ok ? "Preview updated." : "The preview shows what to fix.";
        })
        .catch(function () { status.textContent = "The preview could not be updated."; });
    }
    form.addEventListener("input", function () {
      clearTimeout(timer);
      status.textContent = "Checking…";
      timer = setTimeout(refresh, 500);
    });
  }

  // -- partial page updates: lock / accept / reject / edit without a reload ---------------------
  // A form marked data-partial is sent with fetch; the page the server answers with (the same
  // one a browser without JavaScript gets after its redirect) replaces each [data-region] of
  // this page, and focus returns to the form's data-focus element: a keyboard user keeps their
  // place. Any failure falls back to an ordinary submit.
  function swapRegions(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-region]").forEach(function (region) {
      var next = fresh.getElementById(region.id);
      if (next) { region.replaceWith(document.importNode(next, true)); }
    });
  }

  function setupPartial() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-partial") || !window.fetch) { return; }
      if (form.dataset.sending === "true") { event.preventDefault(); return; }
      event.preventDefault();
      form.dataset.sending = "true";
      var focusId = form.dataset.focus;
      // getAttribute: a form with an input named "action" shadows form.action
      fetch(form.getAttribute("action") || window.location.href, { method: "POST", body: new FormData(form), credentials: "same-origin",
                           headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          if (!response.ok && response.status !== 400) { throw new Error(String(response.status)); }
          return response.text();
        })
        .then(function (html) {
          swapRegions(html);
          var target = focusId && document.getElementById(focusId);
          if (target) { target.focus(); }
          document.dispatchEvent(new CustomEvent("stencil:regions"));
        })
        .catch(function () { delete form.dataset.sending; form.submit(); });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupPartial();
    setupPartSelection();
    var editor = document.getElementById("editor-form");
    if (editor && editor.dataset.previewUrl) { setupEditor(editor); }
    document.addEventListener("stencil:regions", function () {
      document.querySelectorAll("form[data-once]:not([data-once-ready])").forEach(setupOnce);
    });
    var values = document.getElementById("values-form");
    if (values && values.dataset.autosaveUrl) { setupAutosave(values); }
    var doc = document.querySelector(".document[data-selectable=true]");
    if (doc) { setupSelection(doc); }
    var progress = document.getElementById("progress");
    if (progress && progress.dataset.jobUrl) { setupProgress(progress); }
    document.querySelectorAll("form[data-once]").forEach(setupOnce);
    // After a refused submit, start where the first problem is.
    var invalid = document.querySelector("form [aria-invalid=true]");
    if (invalid) { invalid.focus(); }
  });
})();
