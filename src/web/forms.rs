//! The dashboard's forms: every browser request that changes something (a robot's
//! or a slot's action, an update, a rebalance) and the login and logout. Each is
//! checked the same way: actions allowed, a session, and this session's CSRF token
//! from this origin. The pages they answer with are drawn in [`super::pages`].

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::extract::rejection::FormRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;

use super::action::{self, Action};
use super::auth::{self, Denied, Session};
use super::pages::{header_str, page, problem, session, urlencode};
use super::{web_actor, App};

/// A refused browser action, as a page.
pub(super) fn refused(app: &App, s: Option<&Session>, d: Denied) -> Response {
    let (status, text) = match d {
        Denied::Disabled => (
            StatusCode::FORBIDDEN,
            "Actions are disabled: this dashboard is read-only.",
        ),
        Denied::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            "Log in with the dashboard's token first.",
        ),
        Denied::Forged => (
            StatusCode::FORBIDDEN,
            "Refused: this form did not come from this dashboard's page (reload it and try again).",
        ),
        Denied::Throttled => (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many wrong tokens from this address: wait a minute and try again.",
        ),
    };
    problem(app, s, status, "Not allowed", text)
}

/// A form that acts: actions must be allowed (a read-only dashboard answers every
/// write 403, whatever its body), and the form must carry this session's CSRF token
/// from this origin. Returns the session and the form's fields.
fn signed(
    app: &App,
    headers: &HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Result<(Session, HashMap<String, String>), Box<Response>> {
    if !app.auth.actions_allowed() {
        return Err(Box::new(refused(app, None, Denied::Disabled)));
    }
    let Form(form) = form.map_err(|e| {
        Box::new(problem(
            app,
            None,
            StatusCode::BAD_REQUEST,
            "Bad form",
            &e.body_text(),
        ))
    })?;
    app.auth
        .form(
            header_str(headers, header::COOKIE),
            form.get("csrf").map(String::as_str),
            header_str(headers, header::ORIGIN),
            header_str(headers, header::HOST),
        )
        .map(|s| (s, form))
        .map_err(|d| Box::new(refused(app, session(app, headers).as_ref(), d)))
}

async fn form_action(
    app: &App,
    peer: SocketAddr,
    s: &Session,
    target: &str,
    action: Result<Action, String>,
    back: String,
) -> Response {
    let action = match action {
        Ok(a) => a,
        Err(e) => return problem(app, Some(s), StatusCode::NOT_FOUND, "No such action", &e),
    };
    match action::perform(app, target, &action, &web_actor(&s.who, peer)).await {
        Ok(_) => Redirect::to(&back).into_response(),
        Err(e) => problem(
            app,
            Some(s),
            action::failure_status(&e),
            "The action failed",
            &crate::secrets::scrub(&e.to_string()),
        ),
    }
}

/// The update form's fields: the spec as JSON (whole), and a kind when it changes.
fn update_from_form(form: &HashMap<String, String>) -> Result<Action, String> {
    let text = form.get("spec").map(String::as_str).unwrap_or("").trim();
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the spec is not valid JSON: {e}"))?;
    let serde_json::Value::Object(map) = v else {
        return Err("the spec must be a JSON object, like {\"interval_ms\": 500}".into());
    };
    let spec = bson::to_document(&map).map_err(|e| format!("the spec cannot be stored: {e}"))?;
    let kind = form
        .get("kind")
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty());
    Ok(Action::Update { kind, spec })
}

pub(crate) async fn robot_action(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Response {
    let (s, form) = match signed(&app, &headers, form) {
        Ok(signed) => signed,
        Err(res) => return *res,
    };
    let back = if action == "delete" {
        "/robots".to_string()
    } else {
        format!("/robots/{}", urlencode(&name))
    };
    let parsed = if action == "update" {
        update_from_form(&form)
    } else {
        Action::for_robot(&action, form.get("to").cloned())
    };
    form_action(&app, peer, &s, &name, parsed, back).await
}

pub(crate) async fn slot_action(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Response {
    let (s, _) = match signed(&app, &headers, form) {
        Ok(signed) => signed,
        Err(res) => return *res,
    };
    form_action(&app, peer, &s, &id, Action::for_slot(&action), "/".into()).await
}

pub(crate) async fn rebalance(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Response {
    let (s, _) = match signed(&app, &headers, form) {
        Ok(signed) => signed,
        Err(res) => return *res,
    };
    let (store, actor) = (app.store.clone(), web_actor(&s.who, peer));
    let planned = super::to_the_end(async move {
        crate::pool::actions::rebalance(
            &store,
            None,
            false,
            crate::pool::actions::Evening::Count,
            &actor,
        )
        .await
    });
    match planned.await {
        Ok(r) if r.moves.iter().all(|m| m.refused.is_none()) => Redirect::to("/").into_response(),
        Ok(r) => {
            let why: Vec<&str> = r
                .moves
                .iter()
                .filter_map(|m| m.refused.as_deref())
                .collect();
            problem(
                &app,
                Some(&s),
                StatusCode::CONFLICT,
                "Rebalance incomplete",
                &format!("{} robot(s) moved; refused: {}", r.moved(), why.join("; ")),
            )
        }
        Err(e) => problem(
            &app,
            Some(&s),
            action::failure_status(&e),
            "The rebalance failed",
            &crate::secrets::scrub(&e.to_string()),
        ),
    }
}

pub(crate) async fn login_form(State(app): State<App>, headers: HeaderMap) -> Response {
    login_page(&app, &headers, StatusCode::OK, None)
}

fn login_page(app: &App, headers: &HeaderMap, status: StatusCode, note: Option<&str>) -> Response {
    if !app.auth.actions_allowed() {
        return refused(app, None, Denied::Disabled);
    }
    let s = session(app, headers);
    let body = html! {
        h1 { "Log in" }
        @if let Some(n) = note { p.problem { (n) } }
        form #login method="post" action="/login" {
            p { label { "Token " input type="password" name="token" autocomplete="current-password" required; } }
            p { label { "Your name (for the events log) " input type="text" name="who" maxlength="64"; } }
            button type="submit" { "Log in" }
        }
        p { "The token is the one in the dashboard's SLOTPOOL_WEB_TOKEN. Whoever has it can pause, move and delete robots and drain slots." }
    };
    (status, page(app, s.as_ref(), "login", "Log in", body)).into_response()
}

pub(crate) async fn login(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Response {
    if !app.auth.actions_allowed() {
        return refused(&app, None, Denied::Disabled);
    }
    let Ok(Form(form)) = form else {
        return problem(
            &app,
            None,
            StatusCode::BAD_REQUEST,
            "Bad form",
            "send the token and your name as a form",
        );
    };
    let origin = header_str(&headers, header::ORIGIN);
    let host = header_str(&headers, header::HOST);
    if origin.is_some_and(|o| Some(o) != host.map(|h| format!("http://{h}")).as_deref()) {
        return refused(&app, None, Denied::Forged);
    }
    let token = form.get("token").map(String::as_str).unwrap_or("");
    let who = form.get("who").map(String::as_str).unwrap_or("");
    match app.auth.login(token, who, peer.ip()) {
        Ok((id, _)) => {
            let cookie = format!(
                "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                auth::COOKIE,
                auth::SESSION_TTL.as_secs()
            );
            let mut res = Redirect::to("/").into_response();
            if let Ok(v) = header::HeaderValue::from_str(&cookie) {
                res.headers_mut().insert(header::SET_COOKIE, v);
            }
            res
        }
        Err(Denied::Throttled) => refused(&app, None, Denied::Throttled),
        Err(_) => login_page(
            &app,
            &headers,
            StatusCode::UNAUTHORIZED,
            Some("Wrong token."),
        ),
    }
}

pub(crate) async fn logout(
    State(app): State<App>,
    headers: HeaderMap,
    form: Result<Form<HashMap<String, String>>, FormRejection>,
) -> Response {
    if !app.auth.actions_allowed() {
        return refused(&app, None, Denied::Disabled);
    }
    // A forged logout logs nobody out; the cookie is cleared in this browser anyway.
    if signed(&app, &headers, form).is_ok() {
        app.auth.logout(header_str(&headers, header::COOKIE));
    }
    let mut res = Redirect::to("/").into_response();
    let clear = format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        auth::COOKIE
    );
    if let Ok(v) = header::HeaderValue::from_str(&clear) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}
