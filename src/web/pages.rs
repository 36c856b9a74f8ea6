//! The dashboard's HTML pages, written with maud, which escapes every value it
//! interpolates: robot names, specs, contexts, output and errors are hostile input
//! and reach the page only as text. Scripts and styles are served as files
//! (`/static/…`) so the content security policy can forbid inline ones. The forms
//! that act are in [`super::forms`]; the answers shared with the API in
//! [`super::answers`].

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bson::Bson;
use maud::{html, Markup, DOCTYPE};

use super::answers;
use super::auth::Session;
use super::query::{self, RobotQuery};
use super::snapshot::{SlotInfo, Snapshot};
use super::timeline::{SlotNow, Timeline};
use super::{App, RobotDetail, MAX_CONTEXT_SHOWN};
use crate::db::field::{
    CHECKPOINTED_AT, CONTEXT, CREATED_AT, EPOCH, ERROR, GEN, HISTORY, KIND, LINES, PAUSED,
    RESTARTS, SEQ, SLOT_ID, SPEC, STATUS, STREAM, TEXT, UPDATE, UPDATE_RESULT, WORKER,
};
use crate::pool::view::age;

const SCRIPT: &str = include_str!("static/app.js");
const STYLE: &str = include_str!("static/app.css");

pub(super) fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The logged-in browser, if any.
pub(super) fn session(app: &App, headers: &HeaderMap) -> Option<Session> {
    app.auth.session(header_str(headers, header::COOKIE))
}

/// The frame of every page.
pub(super) fn page(
    app: &App,
    s: Option<&Session>,
    name: &str,
    title: &str,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · slotpool" }
                link rel="stylesheet" href="/static/app.css";
            }
            body data-page=(name) data-refresh-ms=(app.refresh.as_millis()) {
                nav {
                    a.brand href="/" { "slotpool" }
                    a href="/" { "Overview" }
                    a href="/robots" { "Robots" }
                    span.who {
                        @if let Some(s) = s {
                            "signed in as " (s.who) " "
                            form.inline method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button type="submit" { "Log out" }
                            }
                        } @else if app.auth.actions_allowed() {
                            a href="/login" { "Log in to act" }
                        } @else {
                            span.readonly { "read-only" }
                        }
                    }
                }
                main { (body) }
                script src="/static/app.js" {}
            }
        }
    }
}

/// A page saying what went wrong, with its status.
pub(super) fn problem(
    app: &App,
    s: Option<&Session>,
    status: StatusCode,
    title: &str,
    text: &str,
) -> Response {
    let body = html! {
        h1 { (title) }
        p.problem { (text) }
        p { a href="/" { "Back to the overview" } " · " a href="/robots" { "All robots" } }
    };
    (status, page(app, s, "problem", title, body)).into_response()
}

fn freshness(s: &Snapshot) -> Markup {
    html! {
        p #freshness {
            @if let Some(e) = &s.error {
                span.error { "The last refresh failed: " (e) }
            } @else {
                "Live: updates every second or two, on the database server's clock."
            }
        }
    }
}

fn summary(s: &Snapshot) -> Markup {
    let sum = &s.summary;
    html! {
        ul #summary {
            li #sum-slots { (sum.held) " of " (sum.slots) " slots held" }
            li #sum-unheld .(if sum.unheld > 0 { "bad" } else { "good" }) { (sum.unheld) " waiting for a worker" }
            li #sum-workers { (sum.workers) " workers, " (sum.standbys) " standby" }
            li #sum-absorb .(if sum.failures_absorbable == 0 { "bad" } else { "good" }) {
                "can absorb " (sum.failures_absorbable) " holder failure(s)"
            }
            li #sum-robots {
                @if s.robots.is_some() {
                    (sum.robots) " robots"
                    @for (state, n) in &sum.robots_by_state { " · " (n) " " (state) }
                } @else { "robots: reading…" }
            }
            @if sum.robots_unplaced > 0 {
                li.bad { (sum.robots_unplaced) " robots bound to no existing slot (see slotpool robot list)" }
            }
        }
    }
}

fn slot_row(slot: &SlotInfo, s: Option<&Session>) -> Markup {
    html! {
        tr data-slot=(slot.id) {
            td.slot { (slot.id) }
            td.state { span.badge.(slot.state) { (slot.state) } }
            td.holder { (slot.holder.as_deref().unwrap_or("-")) }
            td.lease {
                meter min="0" max=(slot.lease_ms.unwrap_or(1)) value=(slot.lease_left_ms.unwrap_or(0)) {}
                " "
                span.left { (slot.lease_left_ms.map_or("-".to_string(), |l| format!("{l} ms"))) }
            }
            td.epoch { (slot.epoch.map_or("-".to_string(), |e| e.to_string())) }
            td.robots { (slot.robots) }
            td.cpu title=(heaviest(slot)) { (slot.cost.as_ref().map_or("-".to_string(), |c| format!("{:.2}", c.total.millicores as f64 / 1000.0))) }
            td.actions {
                @if let Some(s) = s {
                    @let (action, label) = if slot.draining { ("undrain", "Undrain") } else { ("drain", "Drain") };
                    form.inline method="post" action=(format!("/slots/{}/{action}", urlencode(&slot.id))) {
                        input type="hidden" name="csrf" value=(s.csrf);
                        button type="submit" { (label) }
                    }
                }
            }
        }
    }
}

/// A slot's heaviest robots, for the CPU cell's title.
fn heaviest(slot: &SlotInfo) -> String {
    match &slot.cost {
        Some(c) if !c.top.is_empty() => format!(
            "heaviest: {}",
            c.top
                .iter()
                .map(|r| format!("{} {:.2} cores", r.name, r.millicores as f64 / 1000.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "no measured robot".into(),
    }
}

/// A worker's load score, with its parts for the cell's title.
fn load_cell(l: Option<&crate::load::LoadInfo>) -> (String, String) {
    match l {
        Some(l) => (
            format!("{:.1}", l.score),
            format!(
                "CPU {:.0}% of {:.2} cores, executors {} of {}, memory {:.0}%",
                l.cpu * 100.0,
                l.cores,
                l.robots,
                l.capacity,
                l.memory * 100.0
            ),
        ),
        None => ("-".into(), "no load in its heartbeat".into()),
    }
}

fn event_item(e: &super::snapshot::EventInfo) -> Markup {
    html! {
        li {
            span.at { (e.at.as_deref().unwrap_or("?")) } " "
            span.kind { (e.kind) } " "
            @for (k, v) in &e.fields { span.field { (k) "=" (v) } " " }
        }
    }
}

pub(crate) async fn overview(State(app): State<App>, headers: HeaderMap) -> Response {
    let snap = app.snapshot().await;
    let s = session(&app, &headers);
    let body = html! {
        h1 { "The pool" }
        (freshness(&snap))
        (summary(&snap))
        h2 { "Slots" }
        @if let Some(s) = &s {
            form.inline #rebalance method="post" action="/rebalance" {
                input type="hidden" name="csrf" value=(s.csrf);
                button type="submit" title="Even robots out over the non-draining slots with fenced moves" { "Rebalance" }
            }
        }
        table #slots {
            thead { tr { th { "Slot" } th { "State" } th { "Holder" } th { "Lease left" } th { "Epoch" } th { "Robots" } th title="CPU its robots used over the last minute, in cores" { "CPU" } th {} } }
            tbody { @for slot in &snap.slots { (slot_row(slot, s.as_ref())) } }
        }
        @if snap.slots.is_empty() { p { "No slots yet: run " code { "slotpool init --slots N" } "." } }
        h2 { "Workers" }
        table #workers {
            thead { tr { th { "Worker" } th { "Role" } th { "Slot" } th { "Slots held" } th title="Load score: 0 idle, 100 full" { "Load" } th { "Last seen" } th { "Version" } } }
            tbody {
                @for w in &snap.workers {
                    tr {
                        @let (score, parts) = load_cell(w.load.as_ref());
                        td { (w.id) } td { (w.role) } td { (w.slot.as_deref().unwrap_or("-")) } td { (w.held.unwrap_or(0)) }
                        td.load title=(parts) { (score) }
                        td { (age(w.last_seen_ms)) " ago" } td { (w.version.as_deref().unwrap_or("-")) }
                    }
                }
            }
        }
        h2 { "The last hour" }
        p.hint { "Who held each slot (a colour per worker; dashed: overflow), the gaps with no holder (red), self-fences and losses (marks), robot restarts and failures, lost runs and missed firings, and each scheduled robot's latest firing (green: ran well; grey: skipped or stopped; red: failed, lost or missed). As of this page's load: reload to update." }
        (timeline(&snap))
        h2 { "Latest events" }
        ol #events { @for e in &snap.events { (event_item(e)) } }
    };
    page(&app, s.as_ref(), "overview", "Overview", body).into_response()
}

/// The last hour of every slot, from the snapshot's lifecycle events.
fn timeline(snap: &Snapshot) -> Markup {
    if snap.now_ms == 0 {
        return html! { p { "Not read yet." } };
    }
    let slots: Vec<SlotNow> = snap
        .slots
        .iter()
        .map(|s| SlotNow {
            id: s.id.clone(),
            holder: s.holder.clone(),
            lease_ms: s.lease_ms.unwrap_or(2000),
        })
        .collect();
    let firings = snap
        .robots
        .iter()
        .flat_map(|rows| rows.iter())
        .filter_map(|r| {
            let (at, outcome) = r.last_firing?;
            Some(super::timeline::FiringMark {
                at,
                robot: r.name.clone(),
                outcome,
            })
        });
    Timeline::build(&snap.timeline, &slots, snap.now_ms)
        .with_firings(firings)
        .svg()
}

pub(super) fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|v| v.trim_start_matches('=').replace('+', "%20"))
        .unwrap_or_default()
}

fn select(name: &str, label: &str, options: &[&str], chosen: Option<&str>) -> Markup {
    html! {
        label { (label) " "
            select name=(name) {
                option value="" selected[chosen.is_none()] { "any" }
                @for o in options { option value=(o) selected[chosen == Some(*o)] { (o) } }
            }
        }
    }
}

pub(crate) async fn robots(
    State(app): State<App>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let s = session(&app, &headers);
    let q = match query::pairs(raw.as_deref()).and_then(|p| RobotQuery::parse(&p)) {
        Ok(q) => q,
        Err(e) => return problem(&app, s.as_ref(), StatusCode::BAD_REQUEST, "Bad search", &e),
    };
    let snap = app.snapshot().await;
    let slot_ids: Vec<&str> = snap.slots.iter().map(|x| x.id.as_str()).collect();
    let form = html! {
        form #search method="get" action="/robots" {
            label { "Name contains " input type="search" name="q" value=(q.q) maxlength=(query::MAX_TEXT) autofocus; }
            (select("state", "State", &query::states(), q.state.as_deref()))
            (select("slot", "Slot", &slot_ids, q.slot.as_deref()))
            label { "Kind " input type="text" name="kind" value=(q.kind.as_deref().unwrap_or("")) size="8" maxlength=(query::MAX_TEXT); }
            (select("only", "Only", query::ONLY, q.only))
            label { "Sort "
                select name="sort" { @for o in query::SORTS { option value=(o) selected[q.sort == *o] { (o) } } }
            }
            label { "Order "
                select name="order" {
                    option value="asc" selected[!q.desc] { "ascending" }
                    option value="desc" selected[q.desc] { "descending" }
                }
            }
            button type="submit" { "Search" }
        }
    };
    let Some(rows) = &snap.robots else {
        let body = html! {
            h1 { "Robots" } (form)
            p #reading { "Reading the robots (the first pass over every slot takes a few seconds)… reload in a moment." }
        };
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            page(&app, s.as_ref(), "robots", "Robots", body),
        )
            .into_response();
    };
    let p = query::apply(rows, &q);
    let now = snap.now_ms;
    let body = html! {
        h1 { "Robots" }
        (form)
        p #matching {
            (p.matching) " matching · page " (p.page) " of " (p.pages)
            " · table read " (age(snap.robots_at_ms.map(|t| now - t))) " ago; states are live"
        }
        table #robots {
            thead { tr { th { "Name" } th { "Kind" } th { "Slot" } th { "State" } th { "Holder" } th { "Seq" } th { "Restarts" } th { "Last checkpoint" } } }
            tbody {
                @for r in &p.rows {
                    tr data-robot=(r.name) {
                        td.name { a href=(format!("/robots/{}", urlencode(&r.name))) { (r.name) } }
                        td { (r.kind) } td { (r.slot) }
                        td { span.badge.(r.state) title=(r.why.as_deref().unwrap_or("")) { (r.state) } }
                        td { (r.holder.as_deref().unwrap_or("-")) }
                        td { (r.seq.map_or("-".into(), |x| x.to_string())) }
                        td { (r.restarts.unwrap_or(0)) }
                        td { (age(r.checkpointed_at_ms.map(|t| now - t))) }
                    }
                }
            }
        }
        nav.pages {
            @if p.page > 1 { a rel="prev" href=(format!("/robots?{}", q.to_query_string(p.page - 1))) { "← previous" } " " }
            @if p.page < p.pages { a rel="next" href=(format!("/robots?{}", q.to_query_string(p.page + 1))) { "next →" } }
        }
    };
    page(&app, s.as_ref(), "robots", "Robots", body).into_response()
}

fn pretty(v: Option<&Bson>) -> String {
    let Some(v) = v else { return "(none)".into() };
    let text = serde_json::to_string_pretty(&v.clone().into_relaxed_extjson()).unwrap_or_default();
    if text.len() > MAX_CONTEXT_SHOWN {
        let mut cut = MAX_CONTEXT_SHOWN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!(
            "{}\n… cut at {} KiB of {} KiB: see `slotpool robot show NAME --json`",
            &text[..cut],
            MAX_CONTEXT_SHOWN / 1024,
            text.len() / 1024
        )
    } else {
        text
    }
}

fn output_lines(d: &RobotDetail) -> Vec<(String, String)> {
    let Some(Ok(lines)) = d.output.as_ref().map(|o| o.get_array(LINES)) else {
        return Vec::new();
    };
    lines
        .iter()
        .filter_map(|l| l.as_document())
        .map(|l| {
            (
                l.get_str(STREAM).unwrap_or("?").to_string(),
                l.get_str(TEXT).unwrap_or("").to_string(),
            )
        })
        .collect()
}

pub(crate) async fn robot(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let s = session(&app, &headers);
    let snap = app.snapshot().await;
    let d = match app.robot(&name).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            return problem(
                &app,
                s.as_ref(),
                StatusCode::NOT_FOUND,
                "No such robot",
                &format!("There is no robot named {name:?}."),
            )
        }
        Err(e) => {
            return problem(
                &app,
                s.as_ref(),
                StatusCode::SERVICE_UNAVAILABLE,
                "Database unavailable",
                &crate::secrets::scrub(&format!("{e:#}")),
            )
        }
    };
    let v = answers::robot_json(&d, &snap);
    let txt = |k: &str| shown_field(&v.robot, k);
    let state = v.state.to_string();
    let history = d.doc.get_array(HISTORY).ok();
    let events: Vec<_> = snap
        .events
        .iter()
        .filter(|e| e.fields.get("robot") == Some(&name))
        .collect();
    let paused = d.doc.get_bool(PAUSED).unwrap_or(false);
    let scheduled = d
        .doc
        .get_document(SPEC)
        .ok()
        .is_some_and(|s| s.get_document(crate::robot::schedule::SPEC_FIELD).is_ok());
    let href = format!("/robots/{}", urlencode(&name));
    let body = html! {
        h1 { (name) }
        p #state {
            span.badge.(state) { (state) }
            @if let Some(h) = v.holder.as_deref() { " on " span #holder { (h) } }
            @if let Some(why) = v.why.as_deref() { " — " span #why { (why) } }
        }
        @if let Some(s) = &s {
            (robot_actions(&href, &s.csrf, paused, scheduled, &snap.slots, &d.doc, &txt(KIND)))
        }
        @if let Some(u) = update_line(&d.doc) {
            p #update-state { (u) }
        }
        dl #facts {
            @for k in [KIND, SLOT_ID, STATUS, ERROR, SEQ, EPOCH, GEN, RESTARTS, PAUSED, WORKER, CREATED_AT, CHECKPOINTED_AT] {
                dt { (k) } dd data-field=(k) { (txt(k)) }
            }
            @if let Some(limits) = crate::robot::limits::describe_stored(&d.doc) {
                dt { "limits" } dd data-field="limits" { (limits) }
            }
        }
        @if let Some(runs) = runs_section(&d.doc, snap.now_ms) { (runs) }
        h2 { "Context" }
        pre #context { (pretty(d.doc.get(CONTEXT))) }
        h2 { "Spec" }
        pre #spec { (pretty(d.doc.get(SPEC))) }
        @if let Some(h) = history {
            h2 { "Checkpoint history" }
            pre #history { (pretty(Some(&Bson::Array(h.clone())))) }
        }
        h2 { "Latest output" }
        @let lines = output_lines(&d);
        @if lines.is_empty() { p { "No output kept (only exec robots write output)." } }
        @else {
            pre #output { @for (stream, text) in &lines { span.(stream) { (text) } "\n" } }
        }
        h2 { "Its latest events" }
        @if events.is_empty() { p { "None among the latest events." } }
        ol #robot-events { @for e in &events { (event_item(e)) } }
    };
    page(&app, s.as_ref(), "robot", &name, body).into_response()
}

/// The robot page's actions for a signed-in user: pause or resume, restart, run now
/// (scheduled robots), move, delete, and update its spec or kind.
fn robot_actions(
    href: &str,
    csrf: &str,
    paused: bool,
    scheduled: bool,
    slots: &[SlotInfo],
    doc: &bson::Document,
    kind: &str,
) -> Markup {
    html! {
        section #actions {
            @let (act, label) = if paused { ("resume", "Resume") } else { ("pause", "Pause") };
            form.inline method="post" action=(format!("{href}/{act}")) {
                input type="hidden" name="csrf" value=(csrf);
                button #(act) type="submit" { (label) }
            }
            form.inline method="post" action=(format!("{href}/restart")) {
                input type="hidden" name="csrf" value=(csrf);
                button #restart type="submit" { "Restart" }
            }
            @if scheduled {
                form.inline method="post" action=(format!("{href}/trigger")) {
                    input type="hidden" name="csrf" value=(csrf);
                    button #trigger type="submit" title="one extra run now, under the schedule's overlap policy" { "Run now" }
                }
            }
            form.inline method="post" action=(format!("{href}/move")) {
                input type="hidden" name="csrf" value=(csrf);
                select name="to" { @for slot in slots { option value=(slot.id) { (slot.id) } } }
                button #move type="submit" { "Move" }
            }
            form.inline method="post" action=(format!("{href}/delete")) {
                input type="hidden" name="csrf" value=(csrf);
                label { input type="checkbox" name="confirm" value="yes" required; " sure" }
                button #delete type="submit" { "Delete" }
            }
            form #update-form method="post" action=(format!("{href}/update")) {
                input type="hidden" name="csrf" value=(csrf);
                label { "Spec (JSON, the whole spec) " }
                textarea name="spec" rows="6" cols="70" { (pretty(doc.get(SPEC))) }
                label { " Kind " input type="text" name="kind" value=(kind) size="10"; }
                button #update type="submit" { "Update" }
            }
        }
    }
}

/// A field of a robot's JSON answer as the page shows it: `-` for none, a string
/// or a date as its text, anything else as JSON.
fn shown_field(robot: &serde_json::Value, k: &str) -> String {
    match robot.get(k) {
        None | Some(serde_json::Value::Null) => "-".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        // A date, as relaxed extended JSON renders it: {"$date": "…"}.
        Some(serde_json::Value::Object(o)) if o.len() == 1 && o.contains_key("$date") => {
            match &o["$date"] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            }
        }
        Some(other) => other.to_string(),
    }
}

/// The robot's last update as one line: waiting for its holder, applied or refused.
fn update_line(doc: &bson::Document) -> Option<String> {
    if doc.get_document(UPDATE).is_ok() {
        return Some("An update waits for this robot's holder to judge it.".into());
    }
    let r = doc.get_document(UPDATE_RESULT).ok()?;
    let worker = r.get_str(WORKER).unwrap_or("its holder");
    Some(if r.get_bool("applied") == Ok(true) {
        format!("The last update was applied by {worker}.")
    } else {
        format!(
            "The last update was refused by {worker}: {}. Nothing changed.",
            r.get_str("why").unwrap_or("no reason given")
        )
    })
}

pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

pub(crate) async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

pub(crate) async fn not_found(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if method != Method::GET && method != Method::HEAD {
        let mut res = answers::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "nothing to change here: see docs/dashboard.md for the actions",
        );
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return res;
    }
    if uri.path().starts_with("/api/") {
        return answers::error(
            StatusCode::NOT_FOUND,
            "no such API path: see /api/v1 in docs/http.md",
        );
    }
    problem(
        &app,
        session(&app, &headers).as_ref(),
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no page here.",
    )
}

/// A scheduled robot's schedule, next firing and last runs (newest first), or None
/// for a robot without a schedule.
fn runs_section(doc: &bson::Document, now_ms: i64) -> Option<Markup> {
    use crate::db::firing::{runs_of, FiringState};
    use crate::robot::schedule::{rfc3339, Schedule};
    let spec = doc.get_document(SPEC).ok()?;
    spec.get_document(crate::robot::schedule::SPEC_FIELD).ok()?;
    let parsed = Schedule::from_spec(spec, now_ms);
    let st = FiringState::from_robot(doc);
    let (words, next) = match &parsed {
        Ok(Some(s)) => (
            s.describe(),
            s.next_shown(st.claimed, st.running.iter().map(|e| e.firing), now_ms),
        ),
        Ok(None) => return None,
        Err(e) => (format!("invalid: {e}"), None),
    };
    let (due, claimed) = st.due_and_claimed(now_ms);
    let mut runs = runs_of(doc);
    runs.reverse();
    runs.truncate(20);
    Some(html! {
        h2 { "Schedule and runs" }
        p #schedule {
            span #schedule-words { (words) }
            " · next firing " span #next-firing { (next.map_or("-".into(), rfc3339)) }
            " · in flight " (due.len())
            " · claimed ahead " (claimed.len())
            " · run-now requests waiting " (st.triggers.len())
            " · missed in all " (st.missed)
        }
        @if runs.is_empty() { p { "No runs yet." } }
        @else {
            table #runs {
                thead { tr { th { "Firing" } th { "Attempt" } th { "Outcome" } th { "Lateness" } th { "Worker" } th { "By" } th { "Why" } } }
                tbody {
                    @for r in &runs {
                        @let outcome = r.outcome.map_or("?".to_string(), |o| o.to_string());
                        tr data-outcome=(outcome) {
                            td {
                                (rfc3339(r.firing))
                                @if let (Some(last), Some(n)) = (r.last, r.count) { " … " (rfc3339(last)) " (" (n) ")" }
                            }
                            td { (r.attempt) }
                            td { span.badge.(outcome) { (outcome) } }
                            td { (r.lateness_ms.map_or("-".into(), |l| format!("{l} ms"))) }
                            td { (r.worker) }
                            td { (r.by.as_deref().unwrap_or("")) }
                            td { (r.reason.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    })
}
