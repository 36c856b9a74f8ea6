//! Who may act through `slotpool web`: nobody, unless it runs with `--allow-actions`
//! and a token in `SLOTPOOL_WEB_TOKEN`.
//!
//! The API takes `Authorization: Bearer TOKEN` and never reads cookies, so another
//! site cannot call it with a browser's credentials. A browser logs in with the token
//! for a `SameSite=Strict` session cookie, and every acting form carries the session's
//! CSRF token and must come from this server's `Origin`. Sessions live in this process
//! only, for at most [`SESSION_TTL`], at most [`MAX_SESSIONS`] at once (oldest first).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The name of the session cookie.
pub(crate) const COOKIE: &str = "slotpool_session";

/// How long a browser session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The most sessions kept at once.
pub(crate) const MAX_SESSIONS: usize = 1000;

/// The shortest token accepted: guessing 32 characters is out of reach.
pub(crate) const MIN_TOKEN: usize = 32;

/// A logged-in browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Sent back in every form that acts.
    pub(crate) csrf: String,
    /// The name given at login, for events.
    pub(crate) who: String,
    started: Instant,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// Actions are off in this process.
    Disabled,
    /// No credentials, or wrong ones.
    Unauthenticated,
    /// A browser form without this session's CSRF token, or from another origin.
    Forged,
    /// Too many wrong tokens from this address lately: wait (see [`Throttle`]).
    Throttled,
}

/// Wrong tokens allowed from one address within [`FAILURE_WINDOW`]; past them every
/// attempt from it, right or wrong, is refused until the window has passed. A 32
/// character token is out of reach of guessing at this rate; the limit keeps a
/// guesser from costing the dashboard anything.
pub const MAX_FAILURES: u32 = 10;

/// See [`MAX_FAILURES`].
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Addresses tracked at most. When that many are failing at once, the one whose
/// window began longest ago is forgotten to make room: an address that never sent a
/// wrong token is never refused, however many others fail. A guesser spread over
/// more addresses than this gets [`MAX_FAILURES`] guesses per address and window;
/// the token's length (at least [`MIN_TOKEN`] characters) is what keeps those
/// guesses hopeless.
pub const MAX_TRACKED: usize = 10_000;

/// Whether a request's `Host` names this dashboard: an IP address (a browser sends
/// one only when the user typed it), `localhost`, or one of `allowed` (from
/// `--allowed-host`), with any port. Any other name may be a page that rebound its
/// own DNS name to this address to read the pool from the operator's browser.
pub(crate) fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else {
        return false;
    };
    let name = if let Some(v6) = host.strip_prefix('[') {
        return v6
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Failed token attempts by client address: the decision, with time passed in.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    failures: HashMap<IpAddr, (u32, Instant)>,
}

impl Throttle {
    /// Whether `ip` may try a token now: refused only after [`MAX_FAILURES`] wrong
    /// tokens of its own within the window.
    pub(crate) fn allowed(&self, ip: IpAddr, now: Instant) -> bool {
        match self.failures.get(&ip) {
            Some((n, since)) if now.duration_since(*since) < FAILURE_WINDOW => *n < MAX_FAILURES,
            _ => true,
        }
    }

    /// `ip` sent a wrong token.
    pub(crate) fn failed(&mut self, ip: IpAddr, now: Instant) {
        if self.failures.len() >= MAX_TRACKED && !self.failures.contains_key(&ip) {
            self.failures
                .retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
            if self.failures.len() >= MAX_TRACKED {
                let oldest = self
                    .failures
                    .iter()
                    .min_by_key(|(_, (_, since))| *since)
                    .map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    self.failures.remove(&oldest);
                }
            }
        }
        let entry = self.failures.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= FAILURE_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
    }
}

/// The token, when actions are allowed, and the browser sessions.
pub(crate) struct Auth {
    token: Option<String>,
    sessions: Mutex<HashMap<String, Session>>,
    throttle: Mutex<Throttle>,
}

impl Auth {
    /// `token` is Some exactly when actions are allowed; check it with
    /// [`check_token`] first.
    pub(crate) fn new(token: Option<String>) -> Auth {
        Auth {
            token,
            sessions: Mutex::new(HashMap::new()),
            throttle: Mutex::new(Throttle::default()),
        }
    }

    pub(crate) fn actions_allowed(&self) -> bool {
        self.token.is_some()
    }

    /// Checks an `Authorization` header value from `peer`.
    pub(crate) fn bearer(&self, header: Option<&str>, peer: IpAddr) -> Result<(), Denied> {
        let token = self.token.as_deref().ok_or(Denied::Disabled)?;
        let given = header
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or(Denied::Unauthenticated)?;
        self.try_token(given, token, peer)
    }

    /// Whether a write from `peer` to `path` may go on to send its body: refused
    /// at once, from the request head alone, when actions are off, when `peer` is
    /// throttled, or when the credentials the head carries are wrong (a bearer token
    /// for `/api/`, a live session from this origin for a form). So a client that
    /// sends a write's head and then its body a byte at a time holds a connection
    /// only if it holds the token. The handler still checks everything it checked
    /// before (a form's CSRF token is in its body).
    pub(crate) fn before_body(
        &self,
        path: &str,
        headers: &axum::http::HeaderMap,
        peer: IpAddr,
    ) -> Result<(), Denied> {
        use axum::http::header;
        let token = self.token.as_deref().ok_or(Denied::Disabled)?;
        let header = |k: header::HeaderName| headers.get(k).and_then(|v| v.to_str().ok());
        if path.starts_with("/api/") {
            let given = header(header::AUTHORIZATION)
                .and_then(|h| h.strip_prefix("Bearer "))
                .ok_or(Denied::Unauthenticated)?;
            return self.try_token(given, token, peer);
        }
        if !self
            .throttle
            .lock()
            .expect("throttle lock")
            .allowed(peer, Instant::now())
        {
            return Err(Denied::Throttled);
        }
        match path {
            // The token is in the body; the throttle above is all a head can tell.
            "/login" | "/logout" => Ok(()),
            _ => {
                if !same_origin(header(header::ORIGIN), header(header::HOST)) {
                    return Err(Denied::Forged);
                }
                self.session(header(header::COOKIE))
                    .map(|_| ())
                    .ok_or(Denied::Unauthenticated)
            }
        }
    }

    /// Compares a token, counting a wrong one against `peer`.
    fn try_token(&self, given: &str, token: &str, peer: IpAddr) -> Result<(), Denied> {
        let mut throttle = self.throttle.lock().expect("throttle lock");
        let now = Instant::now();
        if !throttle.allowed(peer, now) {
            return Err(Denied::Throttled);
        }
        if same(given.trim().as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            throttle.failed(peer, now);
            Err(Denied::Unauthenticated)
        }
    }

    /// Starts a session for whoever knows the token; returns its id.
    pub(crate) fn login(
        &self,
        given: &str,
        who: &str,
        peer: IpAddr,
    ) -> Result<(String, Session), Denied> {
        let token = self.token.as_deref().ok_or(Denied::Disabled)?;
        self.try_token(given, token, peer)?;
        let session = Session {
            csrf: random_hex(),
            who: clean_name(who),
            started: Instant::now(),
        };
        let id = random_hex();
        let mut sessions = self.sessions.lock().expect("sessions lock");
        sessions.retain(|_, s| s.started.elapsed() < SESSION_TTL);
        if sessions.len() >= MAX_SESSIONS {
            if let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.started)
                .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    /// The session a `Cookie` header names, if it is live.
    pub(crate) fn session(&self, cookie_header: Option<&str>) -> Option<Session> {
        self.token.as_ref()?;
        let id = cookie(cookie_header?, COOKIE)?;
        let sessions = self.sessions.lock().expect("sessions lock");
        sessions
            .get(id)
            .filter(|s| s.started.elapsed() < SESSION_TTL)
            .cloned()
    }

    pub(crate) fn logout(&self, cookie_header: Option<&str>) {
        if let Some(id) = cookie_header.and_then(|h| cookie(h, COOKIE)) {
            self.sessions.lock().expect("sessions lock").remove(id);
        }
    }

    /// Checks a browser form that acts: a live session, its CSRF token, and an
    /// `Origin` (when the browser sends one) that is this server.
    pub(crate) fn form(
        &self,
        cookie_header: Option<&str>,
        csrf: Option<&str>,
        origin: Option<&str>,
        host: Option<&str>,
    ) -> Result<Session, Denied> {
        if self.token.is_none() {
            return Err(Denied::Disabled);
        }
        if !same_origin(origin, host) {
            return Err(Denied::Forged);
        }
        let session = self.session(cookie_header).ok_or(Denied::Unauthenticated)?;
        match csrf {
            Some(c) if same(c.as_bytes(), session.csrf.as_bytes()) => Ok(session),
            _ => Err(Denied::Forged),
        }
    }
}

/// Whether a token is good enough to guard the power to start robots.
pub(crate) fn check_token(token: &str) -> Result<(), String> {
    if token.trim().chars().count() < MIN_TOKEN {
        return Err(format!(
            "SLOTPOOL_WEB_TOKEN must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 32`)"
        ));
    }
    if token.chars().any(char::is_control) {
        return Err("SLOTPOOL_WEB_TOKEN must not contain control characters".into());
    }
    Ok(())
}

/// A request that names an origin must name this server (`http://HOST`).
fn same_origin(origin: Option<&str>, host: Option<&str>) -> bool {
    match (origin, host) {
        (None, _) => true,
        (Some(o), Some(h)) => o == format!("http://{h}") || o == format!("https://{h}"),
        (Some(_), None) => false,
    }
}

/// Compares without stopping at the first difference, so timing tells nothing of
/// how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One cookie's value from a `Cookie` header.
fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|part| {
        let (k, v) = part.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// A name for the events log: printable, at most 64 characters, never empty.
pub(crate) fn clean_name(who: &str) -> String {
    let name: String = who
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    if name.is_empty() {
        "web user".into()
    } else {
        name
    }
}

/// 128 random bits as hex, from the operating system.
fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn only_addresses_localhost_and_allowed_names_are_this_dashboard() {
        let extra = vec!["dash.example.com".to_string()];
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:8080",
            "localhost:8080",
            "LOCALHOST",
            "dash.example.com",
            "Dash.Example.com:443",
        ] {
            assert!(host_allowed(Some(ok), &extra), "{ok}");
        }
        for bad in [
            "attacker.example:8080",
            "attacker.example",
            "127.0.0.1.attacker.example",
            "localhost.attacker.example",
            "[::1",
            "",
        ] {
            assert!(!host_allowed(Some(bad), &extra), "{bad}");
        }
        assert!(!host_allowed(None, &extra), "no Host at all");
    }

    #[test]
    fn wrong_tokens_from_one_address_are_throttled_for_a_window() {
        let mut t = Throttle::default();
        let (a, b) = (ME, IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)));
        let t0 = Instant::now();
        for _ in 0..MAX_FAILURES {
            assert!(t.allowed(a, t0));
            t.failed(a, t0);
        }
        assert!(!t.allowed(a, t0), "throttled");
        assert!(t.allowed(b, t0), "another address is not");
        assert!(t.allowed(a, t0 + FAILURE_WINDOW), "the window passed");
    }

    #[test]
    fn a_flood_of_failing_addresses_locks_out_no_address_that_did_not_fail() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        let addr = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        for i in 0..MAX_TRACKED as u32 + 500 {
            t.failed(addr(i), t0);
        }
        assert!(
            t.failures.len() <= MAX_TRACKED,
            "bounded: {}",
            t.failures.len()
        );
        assert!(t.allowed(ME, t0), "an address that never failed");
        assert!(
            t.allowed(addr(MAX_TRACKED as u32 + 499), t0),
            "one wrong token is no reason"
        );
        // A guesser from one address is still stopped, flood or not.
        for _ in 0..MAX_FAILURES {
            t.failed(ME, t0);
        }
        assert!(!t.allowed(ME, t0));
    }

    #[test]
    fn a_write_is_refused_from_its_head_alone() {
        use axum::http::{header, HeaderMap, HeaderValue};
        let read_only = Auth::new(None);
        let none = HeaderMap::new();
        assert_eq!(
            read_only.before_body("/api/v1/rebalance", &none, ME),
            Err(Denied::Disabled)
        );
        assert_eq!(
            read_only.before_body("/login", &none, ME),
            Err(Denied::Disabled)
        );
        let auth = Auth::new(Some(TOKEN.into()));
        assert_eq!(
            auth.before_body("/api/v1/rebalance", &none, ME),
            Err(Denied::Unauthenticated)
        );
        let mut bearer = HeaderMap::new();
        bearer.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
        );
        assert_eq!(auth.before_body("/api/v1/rebalance", &bearer, ME), Ok(()));
        assert_eq!(
            auth.before_body("/login", &none, ME),
            Ok(()),
            "the token is in the body"
        );
        assert_eq!(
            auth.before_body("/rebalance", &none, ME),
            Err(Denied::Unauthenticated),
            "no session"
        );
        let (id, _) = auth.login(TOKEN, "me", ME).unwrap();
        let mut cookie = HeaderMap::new();
        cookie.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{COOKIE}={id}")).unwrap(),
        );
        assert_eq!(auth.before_body("/rebalance", &cookie, ME), Ok(()));
    }

    #[test]
    fn a_throttled_address_is_refused_even_the_right_token() {
        let auth = Auth::new(Some(TOKEN.into()));
        for _ in 0..MAX_FAILURES {
            assert_eq!(
                auth.bearer(Some("Bearer wrong"), ME),
                Err(Denied::Unauthenticated)
            );
        }
        assert_eq!(
            auth.bearer(Some(&format!("Bearer {TOKEN}")), ME),
            Err(Denied::Throttled)
        );
        assert_eq!(auth.login(TOKEN, "me", ME).unwrap_err(), Denied::Throttled);
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn without_a_token_nothing_is_allowed() {
        let auth = Auth::new(None);
        assert_eq!(auth.bearer(Some("Bearer x"), ME), Err(Denied::Disabled));
        assert_eq!(auth.login(TOKEN, "me", ME).unwrap_err(), Denied::Disabled);
        assert_eq!(
            auth.form(None, None, None, None).unwrap_err(),
            Denied::Disabled
        );
    }

    #[test]
    fn the_api_needs_the_exact_bearer_token() {
        let auth = Auth::new(Some(TOKEN.into()));
        assert_eq!(auth.bearer(Some(&format!("Bearer {TOKEN}")), ME), Ok(()));
        for bad in [
            None,
            Some(TOKEN),
            Some("Bearer "),
            Some("Bearer 0123456789abcdef0123456789abcdeX"),
            Some("Bearer 0123456789abcdef"),
            Some("Basic MDEyMw=="),
        ] {
            assert_eq!(
                auth.bearer(bad, ME),
                Err(Denied::Unauthenticated),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_form_needs_the_session_its_csrf_token_and_this_origin() {
        let auth = Auth::new(Some(TOKEN.into()));
        assert_eq!(
            auth.login("wrong", "me", ME).unwrap_err(),
            Denied::Unauthenticated
        );
        let (id, s) = auth.login(TOKEN, "  ada\u{1b}[31m ", ME).unwrap();
        assert_eq!(s.who, "ada[31m");
        let cookie = format!("other=1; {COOKIE}={id}");
        let host = Some("127.0.0.1:8080");
        let ok = auth.form(
            Some(&cookie),
            Some(&s.csrf),
            Some("http://127.0.0.1:8080"),
            host,
        );
        assert_eq!(ok.unwrap().who, "ada[31m");
        // No Origin header (older browsers, curl): the CSRF token still decides.
        assert!(auth.form(Some(&cookie), Some(&s.csrf), None, host).is_ok());
        assert_eq!(
            auth.form(Some(&cookie), Some("nope"), None, host)
                .unwrap_err(),
            Denied::Forged
        );
        assert_eq!(
            auth.form(Some(&cookie), None, None, host).unwrap_err(),
            Denied::Forged
        );
        assert_eq!(
            auth.form(
                Some(&cookie),
                Some(&s.csrf),
                Some("http://evil.example"),
                host
            )
            .unwrap_err(),
            Denied::Forged
        );
        assert_eq!(
            auth.form(Some("slotpool_session=forged"), Some(&s.csrf), None, host)
                .unwrap_err(),
            Denied::Unauthenticated
        );
        auth.logout(Some(&cookie));
        assert_eq!(
            auth.form(Some(&cookie), Some(&s.csrf), None, host)
                .unwrap_err(),
            Denied::Unauthenticated
        );
    }

    #[test]
    fn short_tokens_are_refused() {
        assert!(check_token("short").unwrap_err().contains("at least 32"));
        assert!(check_token(TOKEN).is_ok());
        assert!(check_token(&format!("{TOKEN}\n\u{7}")).is_err());
    }

    #[test]
    fn sessions_are_bounded() {
        let auth = Auth::new(Some(TOKEN.into()));
        let (first, _) = auth.login(TOKEN, "a", ME).unwrap();
        for _ in 0..MAX_SESSIONS {
            auth.login(TOKEN, "b", ME).unwrap();
        }
        assert_eq!(auth.sessions.lock().unwrap().len(), MAX_SESSIONS);
        assert!(auth.session(Some(&format!("{COOKIE}={first}"))).is_none());
    }
}
