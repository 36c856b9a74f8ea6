//! Keeping the database's credentials out of everything slotpool prints.
//!
//! A MongoDB URI carries secrets in its userinfo and in options such as
//! `authMechanismProperties`, and even a URI that does not parse can be echoed in a
//! driver error. So redaction works on text and errs on hiding too much: [`redact_uri`]
//! hides the userinfo and credential options; [`remember`] records this process's
//! secret fragments (at least [`MIN_FRAGMENT`] long), and [`scrub`] removes them and
//! any `mongodb://` URI from text. Every sink goes through [`scrub`], via
//! [`crate::printable::escape`].

use std::borrow::Cow;
use std::sync::RwLock;

/// What stands in for a hidden secret.
pub(crate) const HIDDEN: &str = "****";

/// The shortest secret fragment [`scrub`] looks for in free text.
pub(crate) const MIN_FRAGMENT: usize = 4;

/// Secret fragments of the URIs this process uses.
static FRAGMENTS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Option names whose values are secrets: anything naming a password, token,
/// secret or key, and `authMechanismProperties` (it carries AWS session tokens).
fn secret_option(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["password", "pwd", "token", "secret", "key", "credential"]
        .iter()
        .any(|w| n.contains(w))
        || n == "authmechanismproperties"
}

/// Where the URI's option pairs start: after the first `?` that follows the last `@`
/// (a `?` inside the userinfo is part of a password), else after the first `?`.
fn options_start(uri: &str) -> Option<usize> {
    let from = uri.rfind('@').map_or(0, |at| at + 1);
    uri[from..].find('?').map(|q| from + q + 1)
}

/// `uri` with its userinfo and every credential-bearing option value replaced by
/// `****`. Works on any text, URI-shaped or not; never fails.
pub(crate) fn redact_uri(uri: &str) -> String {
    let (scheme, rest) = match uri.find("://") {
        Some(i) => (&uri[..i + 3], &uri[i + 3..]),
        None => ("", uri),
    };
    let rest = match rest.rfind('@') {
        Some(at) => format!("{HIDDEN}{}", &rest[at..]),
        None => rest.to_string(),
    };
    let Some(q) = options_start(&rest) else {
        return format!("{scheme}{rest}");
    };
    let mut out = format!("{scheme}{}", &rest[..q]);
    let pairs: Vec<String> = rest[q..]
        .split('&')
        .map(|pair| {
            pair.split(';')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if secret_option(k) => format!("{k}={HIDDEN}"),
                    _ => p.to_string(),
                })
                .collect::<Vec<_>>()
                .join(";")
        })
        .collect();
    out.push_str(&pairs.join("&"));
    out
}

/// The secret parts of a URI: the userinfo, its password, each credential-bearing
/// option value and each `KEY:VALUE` value inside it, raw and percent-decoded.
pub(crate) fn fragments(uri: &str) -> Vec<String> {
    let mut found = Vec::new();
    let rest = uri.find("://").map_or(uri, |i| &uri[i + 3..]);
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        found.push(userinfo.to_string());
        if let Some((_, password)) = userinfo.split_once(':') {
            found.push(password.to_string());
        }
    }
    if let Some(q) = options_start(rest) {
        for pair in rest[q..].split(['&', ';']) {
            if let Some((k, v)) = pair.split_once('=') {
                if secret_option(k) {
                    found.push(v.to_string());
                    for prop in v.split(',') {
                        if let Some((_, pv)) = prop.split_once(':') {
                            found.push(pv.to_string());
                        }
                    }
                }
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|f| percent_decode(f)).collect();
    found.extend(decoded);
    found.retain(|f| f.chars().count() >= MIN_FRAGMENT);
    // Longest first, so a userinfo is hidden whole rather than around its password.
    found.sort_by_key(|f| std::cmp::Reverse(f.len()));
    found.dedup();
    found
}

/// Remembers the secret parts of `uri`, so [`scrub`] hides them wherever they show.
pub(crate) fn remember(uri: &str) {
    let new = fragments(uri);
    if new.is_empty() {
        return;
    }
    let mut all = FRAGMENTS.write().unwrap_or_else(|e| e.into_inner());
    for f in new {
        if !all.contains(&f) {
            all.push(f);
        }
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.len()));
}

/// `text` with every `mongodb://` / `mongodb+srv://` URI redacted and every
/// remembered secret fragment replaced by `****`.
pub(crate) fn scrub(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if out.contains("mongodb://") || out.contains("mongodb+srv://") {
        out = Cow::Owned(redact_uris_in(&out));
    }
    let fragments = FRAGMENTS.read().unwrap_or_else(|e| e.into_inner());
    for f in fragments.iter() {
        if out.contains(f.as_str()) {
            out = Cow::Owned(out.replace(f.as_str(), HIDDEN));
        }
    }
    out
}

/// Redacts each URI found in free text; a URI runs to the next whitespace or quote.
fn redact_uris_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = ["mongodb://", "mongodb+srv://"]
        .iter()
        .filter_map(|s| rest.find(s))
        .min()
    {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '>'))
            .unwrap_or(tail.len());
        out.push_str(&redact_uri(&tail[..end]));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Keeps the connection string away from other processes of the same user, the
/// worker's robots first of all: the process becomes non-dumpable (closing its
/// `/proc/PID/environ`, `mem` and `fd` to anyone without `CAP_SYS_PTRACE`, which
/// robots never have), and every copy of `uri` in the world-readable original
/// argument and environment blocks is overwritten in place with `*`. The URI stays
/// only in this process's heap. Returns how many copies were overwritten.
pub(crate) fn hide_from_other_processes(uri: &str) -> usize {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // Descriptors inherited from whoever started us (a job server's pipes, a
    // supervisor's sockets) would otherwise pass on to every robot.
    close_on_exec_from(3);
    if uri.is_empty() {
        return 0;
    }
    let Some(regions) = start_blocks() else {
        return 0;
    };
    let mut wiped = 0;
    for (start, end) in regions {
        if start == 0 || end <= start {
            continue;
        }
        // SAFETY: [start, end) is this process's argument or environment block as
        // the kernel reports it in /proc/self/stat: mapped, writable memory on the
        // initial stack, which no Rust reference points into (std copies what it
        // reads from it). Writing `*` over bytes keeps every string's length and
        // terminator, so libc's `environ` stays well-formed.
        let block = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
        wiped += overwrite_all(block, uri.as_bytes());
    }
    wiped
}

/// Marks every descriptor from `first` up as close-on-exec, so no program this
/// process starts inherits it. Only syscalls, no allocation: safe between fork and
/// exec. `close_range(CLOSE_RANGE_CLOEXEC)` where the kernel has it (5.11+), else
/// one `fcntl` per possible descriptor.
pub(crate) fn close_on_exec_from(first: u32) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range, getrlimit and fcntl(F_SETFD) only change descriptor
    // flags; an unused descriptor number fails with EBADF and nothing else.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as i32
        } else {
            1024
        };
        for fd in first as i32..top {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// Replaces every occurrence of `needle` in `hay` with `*`s; returns the count.
fn overwrite_all(hay: &mut [u8], needle: &[u8]) -> usize {
    let mut count = 0;
    let mut i = 0;
    while needle.len() <= hay.len() && i + needle.len() <= hay.len() {
        if &hay[i..i + needle.len()] == needle {
            hay[i..i + needle.len()].fill(b'*');
            count += 1;
            i += needle.len();
        } else {
            i += 1;
        }
    }
    count
}

/// `[arg_start, arg_end)` and `[env_start, env_end)` from `/proc/self/stat`
/// (fields 48 to 51, counted from 1; the command name in field 2 may hold spaces,
/// so fields are counted after its closing parenthesis).
fn start_blocks() -> Option<[(usize, usize); 2]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<usize>().ok();
    Some([(field(48)?, field(49)?), (field(50)?, field(51)?)])
}

/// `%XX` sequences decoded (invalid ones kept as they are); `+` stays `+`.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_the_userinfo_whole() {
        assert_eq!(
            redact_uri("mongodb://alice:s3cret@db:27017/slotpool?tls=true"),
            "mongodb://****@db:27017/slotpool?tls=true"
        );
        assert_eq!(
            redact_uri("mongodb://127.0.0.1:27017/x"),
            "mongodb://127.0.0.1:27017/x"
        );
        // An unencoded `/`, `?` or `@` in the password: still hidden, whole.
        assert_eq!(
            redact_uri("mongodb://alice:pa/ss?w@rd@db/x"),
            "mongodb://****@db/x"
        );
        // Not even a scheme.
        assert_eq!(redact_uri("alice:pw@db"), "****@db");
    }

    #[test]
    fn hides_credential_options() {
        let r = redact_uri(
            "mongodb+srv://c.example/x?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok123&tlsCertificateKeyFilePassword=kp;appName=a",
        );
        assert_eq!(
            r,
            "mongodb+srv://c.example/x?authMechanism=MONGODB-AWS&authMechanismProperties=****&tlsCertificateKeyFilePassword=****;appName=a"
        );
        assert!(!r.contains("tok123") && !r.contains("=kp"));
    }

    #[test]
    fn fragments_cover_raw_and_decoded_forms() {
        let f = fragments(
            "mongodb://bob:p%40ss%2Fword@h/?authMechanismProperties=AWS_SESSION_TOKEN:Tok3n,SERVICE_NAME:x",
        );
        for want in [
            "bob:p%40ss%2Fword",
            "p%40ss%2Fword",
            "p@ss/word",
            "AWS_SESSION_TOKEN:Tok3n,SERVICE_NAME:x",
            "Tok3n",
        ] {
            assert!(f.contains(&want.to_string()), "{want} in {f:?}");
        }
        // Too short to hunt for in free text.
        assert!(!f.contains(&"x".to_string()));
    }

    #[test]
    fn scrubs_uris_and_remembered_fragments_in_free_text() {
        remember("mongodb://carol:Zebra-Lantern-42@db/x");
        let s = scrub("auth failed for Zebra-Lantern-42 (user carol)");
        assert_eq!(s, "auth failed for **** (user carol)");
        let s = scrub("cannot parse 'mongodb://dave:Other-Pw@h/x?a=1': bad");
        assert_eq!(s, "cannot parse 'mongodb://****@h/x?a=1': bad");
        assert_eq!(scrub("nothing here"), "nothing here");
    }

    #[test]
    fn overwrites_every_copy() {
        let mut block = b"slotpool\0--mongodb-uri\0mongodb://a:b@h\0X=mongodb://a:b@h\0".to_vec();
        assert_eq!(overwrite_all(&mut block, b"mongodb://a:b@h"), 2);
        assert_eq!(
            block,
            b"slotpool\0--mongodb-uri\0***************\0X=***************\0".to_vec()
        );
        assert!(start_blocks().is_some());
    }

    #[test]
    fn decodes_percent_sequences() {
        assert_eq!(percent_decode("a%2Fb%40c"), "a/b@c");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
