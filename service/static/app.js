// The dashboard page: the job list (polled), one selected job (#job=<id> in the address)
// with its curves, rank trajectories, compression, stage boundaries, layers and checkpoints,
// kept live through the job's event stream, and authenticated downloads.

import {ApiError, api, download, getKey, setKey, streamEvents, takeFragment} from "./api.js";
import {fmtBytes, fmtDuration, fmtNum, fmtRatio, fmtTime, h} from "./dom.js";
import {lineChart} from "./plots.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const LIST_EVERY_MS = 5000;
const REFRESH_MIN_MS = 2000; // live job: at most one refresh of its series per 2 s
const RETRY_STREAM_MS = 5000;
const METRIC_KEYS = ["loss", "val_loss", "accuracy", "val_accuracy", "cosine", "val_cosine",
                     "ratio"];
const LABELS = {loss: "train loss", val_loss: "validation loss", accuracy: "train accuracy",
                val_accuracy: "validation accuracy", cosine: "train cosine",
                val_cosine: "validation cosine"};

const $ = (id) => document.getElementById(id);
const fmtCount = (v) => (v === null || v === undefined ? "–" : v.toLocaleString("en-US"));
const page = {selected: null, gen: 0, stream: null, timer: null, last: 0, busy: false,
              needKey: false, notes: {}};

// -- status line and the key form ----------------------------------------------------------
function status(text, kind = "info") {
  const box = $("status");
  box.hidden = !text;
  box.className = kind;
  box.textContent = text || "";
}

function fail(err) {
  if (err.name === "AbortError") return;
  if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
    page.needKey = true;
    status(`${err.message}. Enter an API key above (or open this page with #key=<key>).`,
           "error");
    $("key-input").focus();
    return;
  }
  status(err.message, "error");
}

function showKeyState() {
  $("key-state").textContent = getKey() ? "key set" : "no key";
  $("key-forget").hidden = !getKey();
}

function setUpKeyForm() {
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    setKey($("key-input").value.trim());
    $("key-input").value = "";
    page.needKey = false;
    status("");
    showKeyState();
    loadJobs();
    if (page.selected) select(page.selected, true);
  });
  $("key-forget").addEventListener("click", () => { setKey(null); showKeyState(); });
  showKeyState();
}

// -- the job list ---------------------------------------------------------------------------
function stateBadge(state) {
  return h("span", {class: `state state-${state.toLowerCase()}`, text: state});
}

function jobRow(job) {
  const p = job.progress || {};
  const ratio = (job.compression || {}).current_ratio;
  return h("tr", {"data-job": job.id, class: job.id === page.selected ? "selected" : null},
    h("td", {}, h("a", {href: `#job=${encodeURIComponent(job.id)}`, text: job.name}),
      h("div", {class: "sub", text: job.id})),
    h("td", {}, stateBadge(job.state)),
    h("td", {}, h("progress", {max: 1, value: p.fraction ?? 0}),
      h("span", {class: "sub", text: ` ${p.step ?? 0} / ${p.total_steps ?? "?"}`})),
    h("td", {class: "num", text: fmtRatio(ratio)}),
    h("td", {class: "sub", text: fmtTime(job.created_at)}));
}

async function loadJobs() {
  if (page.needKey) return;
  try {
    const {items} = await api.jobs();
    $("jobs").tBodies[0].replaceChildren(...items.map(jobRow));
    $("jobs-empty").hidden = items.length > 0;
    $("jobs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if ($("status").className === "error" && !page.selected) status("");
  } catch (err) {
    fail(err);
  }
}

// -- series: from API answers to chart input -----------------------------------------------
function metricSeries(metrics, keys) {
  const byKey = Object.fromEntries(metrics.series.map((sr) => [sr.key, sr.points]));
  return keys.filter((k) => byKey[k]?.length).map((k) => ({
    label: LABELS[k] || k, points: byKey[k].map((p) => ({x: p.step, y: p.value, stage: p.stage})),
  }));
}

function stageMarkers(events, metrics) {
  const seen = new Map();
  for (const e of events.items) {
    if (e.data.phase === "start") seen.set(`${e.data.index}:${e.data.step}`,
                                           {x: e.data.step, label: e.data.name});
  }
  if (seen.size) return [...seen.values()].sort((a, b) => a.x - b.x);
  const loss = metrics.series.find((sr) => sr.key === "loss")?.points || []; // no events: guess
  return loss.filter((p, i) => i === 0 || p.stage !== loss[i - 1].stage)
    .map((p, i) => ({x: i === 0 ? 0 : p.step, label: p.stage || ""}));
}

function bondRanks(ranks) {
  return ranks.length > 2 ? ranks.slice(1, -1) : ranks;
}

function rankSeries(points) {
  const byTensor = new Map();
  for (const p of points) {
    if (!byTensor.has(p.tensor)) byTensor.set(p.tensor, []);
    byTensor.get(p.tensor).push(p);
  }
  return [...byTensor].map(([tensor, pts]) => {
    const last = bondRanks(pts[pts.length - 1].ranks);
    return {label: tensor, legend: `${tensor}  [${last.join("·")}]`, step: true,
            points: pts.map((p) => {
              const bonds = bondRanks(p.ranks);
              return {x: p.step, y: bonds.reduce((a, b) => a + b, 0) / bonds.length};
            })};
  });
}

/** dense / TT parameters of all tensorized layers at each step (last known value per layer). */
function compressionSeries(points, metrics) {
  const tensors = new Set(points.map((p) => p.tensor));
  const now = new Map();
  const out = [];
  for (const p of [...points].sort((a, b) => a.step - b.step)) {
    now.set(p.tensor, p);
    if (now.size < tensors.size) continue;
    let params = 0;
    let dense = 0;
    for (const q of now.values()) { params += q.params; dense += q.dense; }
    const point = {x: p.step, y: params > 0 ? dense / params : null};
    if (out.length && out[out.length - 1].x === p.step) out[out.length - 1] = point;
    else out.push(point);
  }
  if (out.length) return [{label: "tensorized layers: dense / TT parameters", step: true,
                           points: out.filter((p) => p.y !== null)}];
  return metricSeries(metrics, ["ratio"]).map((sr) => ({...sr, label: "compression ratio"}));
}

// -- the selected job ------------------------------------------------------------------------
/** What a user must not miss: a size target the fidelity guard stopped short of, and a
 *  final accuracy at chance level. */
function notices(c) {
  const out = [];
  if (c.target_reached === false) {
    out.push(h("p", {class: "notice warn", id: "target-notice",
                     text: `Size target not reached: ${c.target_reason || "unknown reason"}`}));
  } else if (c.target_reached === true) {
    out.push(h("p", {class: "notice ok", id: "target-notice", text: "Size target reached."}));
  }
  if (c.at_chance) {
    out.push(h("p", {class: "notice bad", id: "chance-notice",
                     text: `Final accuracy at chance level (${fmtNum(c.chance_level)}): `
                           + "the model did not learn the task."}));
  }
  return out;
}

function card(title, value, sub) {
  return h("div", {class: "card"}, h("div", {class: "card-title", text: title}),
           h("div", {class: "card-value", text: value}), h("div", {class: "sub", text: sub || ""}));
}

/** Under the accuracy: the dense baseline's, when the report has one, else the loss. */
function accuracySub(m, report) {
  const base = report?.baseline?.metrics || {};
  const key = ["val_accuracy", "accuracy", "val_cosine", "cosine"].find((k) => k in base);
  if (key) return `dense baseline ${fmtNum(base[key])}`;
  return m.val_loss !== undefined ? `validation loss ${fmtNum(m.val_loss)}` : "";
}

function cards(job, report) {
  const p = job.progress || {};
  const c = job.compression || {};
  const m = job.latest_metrics || {};
  const acc = m.val_accuracy ?? m.accuracy ?? m.val_cosine ?? m.cosine;
  return h("div", {class: "cards"},
    card("Stage", p.stage_name ? `${p.stage_name}` : "–",
         p.stage_count ? `stage ${(p.stage_index ?? 0) + 1} of ${p.stage_count}` : ""),
    card("Step", `${p.step ?? 0} / ${p.total_steps ?? "?"}`,
         `${Math.round((p.fraction ?? 0) * 100)}% · ${fmtDuration(job.started_at, job.finished_at)}`),
    report?.tensorized_ratio
      ? card("Compression", fmtRatio(report.tensorized_ratio),
             `tensorized layers · whole model ${fmtRatio(report.model_ratio)} `
             + `(${fmtCount(report.params_dense)} → ${fmtCount(report.params)} parameters)`)
      : card("Compression", fmtRatio(c.current_ratio), c.params_before
        ? `${fmtNum(c.params_before)} → ${fmtNum(c.params_now)} parameters` : ""),
    card("Saved file", fmtRatio(report?.file_ratio ?? c.file_ratio),
         (report || c.file_bytes) ? `${fmtBytes(report?.file_bytes ?? c.file_bytes)} vs `
           + `${fmtBytes(report?.dense_bytes ?? c.dense_bytes)} dense` : "after export"),
    card("Accuracy", acc === undefined ? "–" : fmtNum(acc), accuracySub(m, report)),
    card("Attempt", `${job.attempt} of ${job.max_attempts}`, `created ${fmtTime(job.created_at)}`));
}

function layersTable(report) {
  if (!report) return h("p", {class: "sub", text: "The per-layer report appears once the "
                                                   + "compressed model is exported."});
  return h("table", {class: "layers"},
    h("thead", {}, h("tr", {}, h("th", {text: "Layer"}), h("th", {text: "Kind"}),
      h("th", {text: "Bond ranks"}), ...["Dense params", "Params", "Ratio"]
        .map((t) => h("th", {class: "num", text: t})))),
    h("tbody", {}, ...report.layers.map((l) => h("tr", {},
      h("td", {text: l.name}), h("td", {text: l.kind}),
      h("td", {text: bondRanks(l.ranks).join(" · ")}),
      h("td", {class: "num", text: fmtNum(l.dense_params)}),
      h("td", {class: "num", text: fmtNum(l.params)}),
      h("td", {class: "num", text: fmtRatio(l.ratio)})))));
}

/** The report's metrics beside its dense baseline's (a SUCCEEDED dense job of the same spec),
 *  with the deltas (this job - baseline); as ``comera report`` shows them. */
function baselineTable(report) {
  const base = report?.baseline;
  if (!base) return null;
  const keys = [...new Set([...Object.keys(report.metrics), ...Object.keys(base.metrics)])].sort();
  const signed = (v) => (v === undefined ? "–" : `${v > 0 ? "+" : ""}${fmtNum(v)}`);
  return h("table", {class: "baseline", id: "baseline-table"},
    h("caption", {text: `Against the dense baseline ${base.job_id}`}),
    h("thead", {}, h("tr", {}, h("th", {text: "Metric"}),
      ...["This job", "Dense baseline", "Delta"].map((t) => h("th", {class: "num", text: t})))),
    h("tbody", {}, ...keys.map((k) => h("tr", {"data-metric": k},
      h("td", {text: k}),
      h("td", {class: "num", text: fmtNum(report.metrics[k])}),
      h("td", {class: "num", text: fmtNum(base.metrics[k])}),
      h("td", {class: "num", text: signed(base.deltas[k])})))));
}

const MIB = 2 ** 20;

/** ``hf`` jobs: the exported model/hf/ beside the original as deployed (task metric,
 *  parameters, file bytes, latency and peak memory at batch 1 and at a throughput batch);
 *  the columns of ``comera report``'s deployment table. */
function deployTable(report) {
  const d = report?.deploy;
  if (!d) return null;
  const e = d.exported;
  const o = d.original;
  const r = d.ratios || {};
  const row = (name, exported, original, ratio, key) => h("tr", {"data-row": key},
    h("td", {text: name}), h("td", {class: "num", text: exported}),
    h("td", {class: "num", text: original}), h("td", {class: "num", text: ratio}));
  const rows = [...new Set([...Object.keys(e.metrics), ...Object.keys(o.metrics)])].sort()
    .map((k) => row(k, fmtNum(e.metrics[k]), fmtNum(o.metrics[k]), "", `metric:${k}`));
  rows.push(row("parameters", fmtCount(e.parameters), fmtCount(o.parameters),
                fmtRatio(r.parameters), "parameters"));
  rows.push(row("file bytes", fmtCount(e.file_bytes || null), fmtCount(o.file_bytes || null),
                fmtRatio(r.file_bytes), "file_bytes"));
  for (const key of ["batch_1", "throughput"]) {
    const eb = e[key];
    const ob = o[key];
    const speed = r[key === "batch_1" ? "speedup_batch_1" : "speedup_throughput"];
    rows.push(row(`latency, batch ${eb.batch}`, `${eb.latency_ms.toFixed(2)} ms`,
                  `${ob.latency_ms.toFixed(2)} ms`, fmtRatio(speed), `latency:${key}`));
    const mem = key === "throughput" ? r.memory_throughput : undefined;
    rows.push(row(`peak memory, batch ${eb.batch}`, `${(eb.peak_bytes / MIB).toFixed(1)} MiB`,
                  `${(ob.peak_bytes / MIB).toFixed(1)} MiB`,
                  mem === undefined ? "" : fmtRatio(mem), `memory:${key}`));
  }
  const threads = d.threads ? `, ${d.threads} threads` : "";
  return h("table", {class: "deploy", id: "deploy-table"},
    h("caption", {text: `Deployment on ${d.device}${threads}, ${d.seq_len} tokens a sequence`}),
    h("thead", {}, h("tr", {}, h("th", {text: ""}),
      ...["Exported (model/hf/)", `Original (${o.kind || "dense"})`, "Original / exported"]
        .map((t) => h("th", {class: "num", text: t})))),
    h("tbody", {}, ...rows));
}

function checkpointsTable(items) {
  return h("table", {class: "checkpoints"},
    h("thead", {}, h("tr", {}, ...["Kind", "Step", "Stage", "Size", "sha256", ""]
      .map((t) => h("th", {class: t === "Step" || t === "Size" ? "num" : null, text: t})))),
    h("tbody", {}, ...items.map((c) => h("tr", {"data-checkpoint": c.id},
      h("td", {text: c.kind}), h("td", {class: "num", text: c.step}),
      h("td", {text: c.stage || ""}), h("td", {class: "num", text: fmtBytes(c.size_bytes)}),
      h("td", {class: "mono", title: c.sha256 || "", text: (c.sha256 || "").slice(0, 12)}),
      h("td", {}, c.state === "complete"
        ? h("button", {class: "small", onclick: (ev) => save(c, ev.currentTarget),
                       text: "Download"})
        : c.state)))));
}

/** A job on a mix of text sources: the last stage's validation metrics per source (the
 *  engine's ``metrics_by_source``), as ``comera report`` lists them under the metrics. */
function sourcesTable(report) {
  const stages = report?.stages || [];
  const parts = stages.length ? stages[stages.length - 1].metrics_by_source : null;
  if (!parts || !Object.keys(parts).length) return null;
  const sources = Object.keys(parts);
  const keys = [...new Set(sources.flatMap((src) => Object.keys(parts[src])))].sort();
  return h("table", {class: "sources", id: "sources-table"},
    h("caption", {text: "Validation metrics per source of the text (last stage)"}),
    h("thead", {}, h("tr", {}, h("th", {text: "Source"}),
      ...keys.map((k) => h("th", {class: "num", text: k})))),
    h("tbody", {}, ...sources.map((src) => h("tr", {"data-source": src},
      h("td", {text: src}), ...keys.map((k) => h("td", {class: "num",
                                                       text: fmtNum(parts[src][k])}))))));
}

/** What the compressed model is worth beside a dense one: the dense baseline's metrics, the
 *  metrics per source of a mixed text split and, for ``hf`` jobs, the deployment table. */
function comparisons(report) {
  if (!report) return [];
  const base = baselineTable(report);
  const sources = sourcesTable(report);
  const deploy = deployTable(report);
  return [
    h("h3", {text: "Dense baseline"}),
    base || h("p", {class: "sub", id: "baseline-none",
                    text: "No dense baseline: no SUCCEEDED dense job of the same spec "
                          + "(submit the spec with compression.method \"dense\" to get one)."}),
    ...(sources ? [h("h3", {text: "By source"}), sources] : []),
    ...(deploy ? [h("h3", {text: "Deployment"}), deploy] : []),
  ];
}

function renderDetail(d) {
  const {job, metrics, ranks, events, checkpoints, report} = d;
  const markers = stageMarkers(events, metrics);
  const exp = checkpoints.items.find((c) => c.kind === "export" && c.state === "complete");
  const note = page.notes[job.id] || {};
  const accKeys = metrics.series.some((sr) => sr.key === "accuracy" || sr.key === "val_accuracy")
    ? ["accuracy", "val_accuracy"] : ["cosine", "val_cosine"];
  $("detail").replaceChildren(
    h("div", {class: "detail-head"},
      h("h2", {}, job.name, " ", stateBadge(job.state)),
      h("div", {class: "sub", text: `${job.id}${job.message ? ` · ${job.message}` : ""}`})),
    ...(job.error ? [h("p", {class: "job-error",
                             text: `${job.error.title}: ${job.error.detail || ""}`})] : []),
    ...notices(job.compression || {}),
    cards(job, report),
    h("div", {class: "actions"},
      h("button", {id: "download-export", disabled: !exp,
                   onclick: (ev) => save(exp, ev.currentTarget),
                   text: exp ? `Download compressed model (${fmtBytes(exp.size_bytes)})`
                     : "Compressed model not exported yet"}),
      h("span", {id: "download-status", class: note.kind || "", text: note.text || ""})),
    h("div", {class: "plots"},
      lineChart({name: "loss", title: "Loss", markers,
                 series: metricSeries(metrics, ["loss", "val_loss"])}),
      lineChart({name: "accuracy", title: accKeys[0] === "accuracy" ? "Accuracy" : "Cosine",
                 markers, yDomain: [0, 1], series: metricSeries(metrics, accKeys)}),
      lineChart({name: "ranks", title: "Rank trajectory (mean bond rank per layer)", markers,
                 yDomain: [0, 1], series: rankSeries(ranks.points)}),
      lineChart({name: "compression", title: "Compression over time (×)", markers,
                 yDomain: [1, 1], series: compressionSeries(ranks.points, metrics)})),
    h("h3", {text: "Layers"}), layersTable(report),
    ...comparisons(report),
    h("h3", {text: "Checkpoints"}), checkpointsTable(checkpoints.items));
}

async function refreshDetail() {
  const id = page.selected;
  const gen = page.gen;
  if (!id || page.busy) { if (id) scheduleRefresh(); return; }
  page.busy = true;
  page.last = Date.now();
  try {
    const [job, metrics, ranks, events, checkpoints] = await Promise.all([
      api.job(id), api.metrics(id, METRIC_KEYS), api.ranks(id), api.stageEvents(id),
      api.checkpoints(id)]);
    const exported = job.state === "SUCCEEDED" || (job.compression || {}).report_checkpoint_id;
    const report = exported ? await api.report(id).catch(() => null) : null;
    if (gen !== page.gen) return;
    renderDetail({job, metrics, ranks, events, checkpoints, report});
    $("detail").dataset.job = id;
    $("detail").dataset.state = job.state;
    if (!TERMINAL.has(job.state) && !page.stream) follow(id, gen);
  } catch (err) {
    if (gen === page.gen) fail(err);
  } finally {
    page.busy = false;
  }
}

function scheduleRefresh() {
  if (page.timer) return;
  const wait = Math.max(0, page.last + REFRESH_MIN_MS - Date.now());
  page.timer = setTimeout(() => { page.timer = null; refreshDetail(); }, wait);
}

/** Follow a live job's events; each one schedules a (throttled) refresh. */
async function follow(id, gen) {
  const ctrl = new AbortController();
  page.stream = ctrl;
  let after = 0;
  while (gen === page.gen) {
    try {
      after = await streamEvents(id, {after, signal: ctrl.signal, onEvent: scheduleRefresh});
      break; // the server ends the stream once the job has finished
    } catch (err) {
      if (err.name === "AbortError" || gen !== page.gen) return;
      fail(err);
      if (err instanceof ApiError && err.status >= 400 && err.status < 500) return;
      await new Promise((done) => setTimeout(done, RETRY_STREAM_MS));
      scheduleRefresh(); // polling while the stream is down
    }
  }
  if (gen !== page.gen) return;
  page.stream = null;
  clearTimeout(page.timer);
  page.timer = null;
  await refreshDetail();
  loadJobs();
}

function select(id, force = false) {
  if (id === page.selected && !force) return;
  page.gen += 1;
  page.stream?.abort();
  page.stream = null;
  page.selected = id;
  for (const row of $("jobs").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.job === id);
  }
  $("detail").replaceChildren(h("p", {class: "sub", text: `Loading ${id}…`}));
  refreshDetail();
}

// -- downloads -------------------------------------------------------------------------------
function hex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

async function save(ckpt, button) {
  const jobId = ckpt.job_id;
  const show = (text, kind) => {
    page.notes[jobId] = {text, kind};
    const box = $("download-status");
    if (box && page.selected === jobId) { box.textContent = text; box.className = kind; }
  };
  button.disabled = true;
  show(`downloading ${ckpt.id}…`, "info");
  try {
    const {blob, filename} = await download(ckpt.links.content);
    let checked = "";
    if (globalThis.crypto?.subtle && ckpt.sha256) { // only in a secure context (https, localhost)
      const digest = hex(await crypto.subtle.digest("SHA-256", await blob.arrayBuffer()));
      if (digest !== ckpt.sha256) throw new Error(`sha256 mismatch: got ${digest}`);
      checked = ", sha256 verified";
    }
    const url = URL.createObjectURL(blob);
    const link = h("a", {href: url, download: filename, hidden: true});
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    show(`saved ${filename} (${fmtBytes(blob.size)}${checked})`, "ok");
  } catch (err) {
    show(`download failed: ${err.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

// -- start -----------------------------------------------------------------------------------
function fromFragment() {
  const job = takeFragment().get("job");
  showKeyState();
  if (job) select(job);
}

setUpKeyForm();
window.addEventListener("hashchange", fromFragment);
fromFragment();
loadJobs();
setInterval(() => { if (!document.hidden) loadJobs(); }, LIST_EVERY_MS);
